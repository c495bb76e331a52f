"""A script (SSML) through the real voice: breaks, rates and volumes measured in the audio, marks
timed to the frame, word spans into the document."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.voices import SECOND_SAMPLE_RATE, SECOND_VOICE
from ttsvc.backends.loader import load_engine_set
from ttsvc.errors import NothingToSay, VoiceUnavailable
from ttsvc.protocol import ScriptRun, ScriptText, WordTime
from ttsvc.repository.layout import EngineRepository
from ttsvc.synthesis.params import SynthesisParams
from ttsvc.synthesis.synthesizer import Synthesizer
from ttsvc.text.ssml import parse_ssml

QUIET = SynthesisParams(noise_scale=0.0, noise_w=0.0, timestamps=True)


def say(synth: Synthesizer, source: str,
        params: SynthesisParams = QUIET) -> tuple[np.ndarray, list[WordTime]]:  # fmt: skip
    parsed = parse_ssml(source, symbols=set(synth.engines.voice.phoneme_id_map))
    chunks = list(synth.stream("", params, script=parsed.script))
    assert chunks[-1].last and sum(c.last for c in chunks) == 1
    offsets = [c.offset for c in chunks]
    assert offsets == sorted(offsets)
    return np.concatenate([c.samples for c in chunks]), [w for c in chunks for w in c.words]


def words_of(timed: list[WordTime]) -> list[WordTime]:
    return [w for w in timed if not w.mark]


def test_a_break_at_a_sentence_end_adds_exactly_its_time(synth: Synthesizer) -> None:
    plain, _ = say(synth, "<speak>Hello there. Call me now.</speak>")
    broken, _ = say(synth, '<speak>Hello there. <break time="700ms"/>Call me now.</speak>')
    assert len(broken) - len(plain) == round(0.7 * synth.sample_rate)
    cut = len(say(synth, "<speak>Hello there.</speak>")[0])
    # the same audio on either side, the silence between longer by the break
    assert np.array_equal(broken[:cut], plain[:cut])
    assert np.array_equal(broken[-(len(plain) - cut) :], plain[cut:])


def test_a_break_mid_sentence_is_silence_of_its_length(synth: Synthesizer) -> None:
    audio, timed = say(synth, '<speak>Wait <break time="700ms"/>for it.</speak>')
    wait, after = words_of(timed)[0], words_of(timed)[1]
    gap = audio[round(wait.end * synth.sample_rate) : round(after.start * synth.sample_rate)]
    frame = synth.hop
    assert after.start - wait.end >= 0.7 - frame / synth.sample_rate
    assert np.count_nonzero(np.abs(gap.astype(np.int32)) < 64) >= 0.7 * synth.sample_rate - frame


def test_a_leading_break_delays_everything(synth: Synthesizer) -> None:
    plain, words = say(synth, "<speak>Hello.</speak>")
    late, later = say(synth, '<speak><break time="1s"/>Hello.</speak>')
    assert len(late) - len(plain) == synth.sample_rate
    assert not late[: synth.sample_rate].any()
    assert later[0].start == pytest.approx(words[0].start + 1.0)


def test_a_slow_rate_lengthens_its_span_and_nothing_else(synth: Synthesizer) -> None:
    _, plain = say(synth, "<speak>One two. Three four. Five six.</speak>")
    _, slow = say(synth, '<speak>One two. <prosody rate="x-slow">Three four.</prosody> '
                         "Five six.</speak>")  # fmt: skip
    lengths = [[w.end - w.start for w in words_of(t)] for t in (plain, slow)]
    assert lengths[1][:2] == pytest.approx(lengths[0][:2], abs=1e-9)
    assert lengths[1][4:] == pytest.approx(lengths[0][4:], abs=1e-9)
    for before, after in zip(lengths[0][2:4], lengths[1][2:4], strict=True):
        assert after > 1.5 * before


def test_volume_scales_the_samples(synth: Synthesizer) -> None:
    loud, _ = say(synth, "<speak>Hello there.</speak>")
    soft, _ = say(synth, '<speak><prosody volume="-6dB">Hello there.</prosody></speak>')
    assert len(soft) == len(loud)
    ratio = np.abs(soft).max() / np.abs(loud).max()
    assert ratio == pytest.approx(10 ** (-6 / 20), rel=0.01)
    hush, _ = say(synth, '<speak><prosody volume="silent">Hello there.</prosody></speak>')
    assert not hush.any()


def test_marks_are_timed_to_the_frame_and_spans_index_the_document(synth: Synthesizer) -> None:
    source = (
        '<speak><mark name="start"/>Call <say-as interpret-as="digits">42</say-as> '
        '<mark name="mid"/>now, <phoneme ph="təmˈɑːtoʊ">tomato</phoneme> please.'
        '<mark name="end"/></speak>'
    )
    audio, timed = say(synth, source)
    frame_s = synth.hop / synth.sample_rate
    marks = {w.word: w for w in timed if w.mark}
    words = words_of(timed)
    assert [w.word for w in words] == ["Call", "four", "two", "now", "tomato", "please"]
    assert [source[w.text_span[0] : w.text_span[1]] for w in words] == [
        "Call",
        "42",
        "42",
        "now",
        "tomato",
        "please",
    ]
    now = next(w for w in words if w.word == "now")
    assert marks["mid"].start == now.start
    assert marks["start"].start == words[0].start
    assert abs(marks["end"].start - len(audio) / synth.sample_rate) < frame_s
    for name, mark in marks.items():
        assert source[mark.text_span[0] :].startswith(f'<mark name="{name}"')
        assert round(mark.start / frame_s, 6).is_integer()  # on a frame boundary


def test_a_phoneme_says_its_symbols(synth: Synthesizer) -> None:
    (run,) = parse_ssml('<speak>A <phoneme ph="təmˈɑːtoʊ">tomato</phoneme>.</speak>').script
    (sentence,) = synth.frontend.run_sentences(run, words=True)  # type: ignore[arg-type]
    assert "təmˈɑːtoʊ" in "".join(sentence.phonemes)
    tomato = sentence.words[-1]
    id_map = synth.engines.voice.phoneme_id_map
    assert sentence.ids[tomato.ids[0]] == id_map["t"][0]


def test_nothing_to_say_in_any_run(synth: Synthesizer) -> None:
    with pytest.raises(NothingToSay):
        say(synth, '<speak>... <break time="1s"/> !!</speak>')


def test_without_timestamps_marks_cost_nothing(synth: Synthesizer) -> None:
    params = SynthesisParams(noise_scale=0.0, noise_w=0.0)
    audio, timed = say(synth, '<speak>Hi <mark name="m"/>there.</speak>', params)
    assert timed == [] and len(audio)


@pytest.fixture(scope="module")
def second(second_voice_root: Path) -> Synthesizer:
    """The derived second voice: 16000 Hz, a 1.3 length scale (``tests/voices.py``)."""
    version = EngineRepository(second_voice_root).latest(SECOND_VOICE)
    assert version is not None
    return Synthesizer(load_engine_set(version.path))


def test_a_run_in_another_voice_is_its_audio_at_the_stream_s_rate(
    synth: Synthesizer, second: Synthesizer
) -> None:
    source = '<speak>Hello there. <voice name="narrator">Good day.</voice> Bye now.</speak>'
    parsed = parse_ssml(source, voice_of=lambda _name: SECOND_VOICE)
    chunks = list(synth.stream("", QUIET, script=parsed.script, voices={SECOND_VOICE: second}))
    audio = np.concatenate([c.samples for c in chunks])
    words = [w for c in chunks for w in c.words]
    params = SynthesisParams(noise_scale=0.0, noise_w=0.0)
    first, last = (len(synth.synthesize(t, params)) for t in ("Hello there.", "Bye now."))
    theirs = len(second.synthesize("Good day.", params))  # at 16000 Hz
    pause = round(0.2 * synth.sample_rate)
    middle = len(audio) - first - last - 2 * pause
    assert abs(middle - theirs * synth.sample_rate / SECOND_SAMPLE_RATE) <= 2  # resampled
    own = synth.synthesize("Hello there.", params).astype(np.int32)
    assert np.abs(audio[:first].astype(np.int32) - own).max() <= 2  # streamed vs one-shot
    good = next(w for w in words if w.word == "Good")
    span_s = (first + pause) / synth.sample_rate, (first + pause + middle) / synth.sample_rate
    assert span_s[0] <= good.start < span_s[1]
    assert source[good.text_span[0]:good.text_span[1]] == "Good"
    offsets = [c.offset for c in chunks]
    assert offsets == sorted(offsets) and chunks[-1].offset + len(chunks[-1].samples) == len(audio)


def test_a_voice_not_handed_to_the_stream_fails_it(synth: Synthesizer) -> None:
    parsed = parse_ssml('<speak><voice name="x">Hi.</voice></speak>', voice_of=lambda _n: "x")
    with pytest.raises(VoiceUnavailable):
        list(synth.stream("", QUIET, script=parsed.script))


def test_a_mark_before_trailing_punctuation_is_kept(synth: Synthesizer) -> None:
    audio, timed = say(synth, '<speak><prosody rate="slow">Wait</prosody><mark name="done"/>.'
                              "</speak>")  # fmt: skip
    (done,) = [w for w in timed if w.mark]
    assert done.word == "done"
    assert abs(done.start - len(audio) / synth.sample_rate) < synth.hop / synth.sample_rate


def test_phonemes_without_a_sentence_end_still_make_sentences_of_a_bounded_size(
    synth: Synthesizer,
) -> None:
    pieces = []
    for i in range(60):  # a product list of lexicon words: no full stop anywhere
        at = 10 * i
        pieces += [ScriptText("and ", (at, at + 4)),
                   ScriptText("Acme", (at + 4, at + 8), verbatim=False, phonemes="ˈækmi")]
    found = synth.frontend.run_sentences(ScriptRun(tuple(pieces)), words=True)
    assert len(found) > 1
    cap = synth.frontend.max_sentence_chars
    assert all(len(s.text) <= cap + 10 for s in found)
    assert sum(1 for s in found for w in s.words if w.text == "Acme") == 60


def test_a_sentence_is_cut_by_the_phonemes_it_says_not_the_word_they_name(
    synth: Synthesizer,
) -> None:
    """Forty one-letter words each said by 50 symbols: 2,000 symbols and 40 letters. The cut
    counts the symbols, which the acoustic model reads at once."""
    pieces = [ScriptText("x", (2 * i, 2 * i + 1), verbatim=False, phonemes="ˈækmi" * 10)
              for i in range(40)]  # fmt: skip
    found = synth.frontend.run_sentences(ScriptRun(tuple(pieces)))
    cap = synth.frontend.max_sentence_chars
    assert len(found) >= 2000 // (2 * cap)
    assert all(len(s.phonemes) <= cap + 60 for s in found)
    assert sum(s.phonemes.count("æ") for s in found) == 400


def test_a_word_said_by_phonemes_stays_in_its_sentence_before_a_long_text(
    synth: Synthesizer,
) -> None:
    """The cut weighs the next sentence of the text, not all the text that follows: a lexicon
    word early in a paragraph keeps its sentence's intonation."""
    rest = " makes tools for the home. " + "Our shops are open every day of the week. " * 6
    pieces = (ScriptText("Today our brand ", (0, 16)),
              ScriptText("Acme", (16, 20), verbatim=False, phonemes="ˈækmi"),
              ScriptText(rest, (20, 20 + len(rest))))  # fmt: skip
    found = synth.frontend.run_sentences(ScriptRun(pieces))
    assert " ".join(found[0].text.split()) == "Today our brand Acme makes tools for the home."
    assert len(found) == 7
