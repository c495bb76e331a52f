"""The streaming synthesizer against the unsplit Piper graph, with the real default voice."""

from __future__ import annotations

import itertools

import numpy as np
import onnxruntime as ort
import pytest

from tests.conftest import run_piper
from ttsvc.errors import AudioTooLong, InvalidParameter, NothingToSay, UnsupportedScript
from ttsvc.synthesis import SynthesisParams, Synthesizer, to_pcm16
from ttsvc.windows import WindowSchedule

DETERMINISTIC = SynthesisParams(noise_scale=0.0, noise_w=0.0)
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Is this the right way to the station?",
    "Press one for English, or two for Spanish.",
    "Hi.",
]
SCHEDULES = [
    WindowSchedule(first=1, growth=2.0, max=64),
    WindowSchedule(first=4, growth=2.0, max=128),
    WindowSchedule(first=8, growth=2.0, max=128),
    WindowSchedule(first=16, growth=1.0, max=16),
    WindowSchedule(first=12, growth=1.5, max=48),
    WindowSchedule(first=512, growth=1.0, max=512),  # one window longer than any sentence
]


@pytest.mark.parametrize("text", SENTENCES)
def test_one_shot_equals_unsplit_piper_graph(
    text: str, synth: Synthesizer, piper_graph: ort.InferenceSession
) -> None:
    for sentence in synth.sentences(text):
        expected = run_piper(piper_graph, sentence.ids, [0.0, 1.0, 0.0])
        got = synth.one_shot(sentence.ids, DETERMINISTIC)
        assert got.shape == expected.shape
        assert np.max(np.abs(got - expected)) <= 1e-4


@pytest.mark.parametrize("schedule", SCHEDULES, ids=str)
@pytest.mark.parametrize("text", SENTENCES)
def test_streamed_equals_one_shot(text: str, schedule: WindowSchedule, synth: Synthesizer) -> None:
    for sentence in synth.sentences(text):
        latents = synth.latents(sentence.ids, DETERMINISTIC)
        pieces = list(synth.windows(latents, schedule))
        streamed = np.concatenate(pieces)
        one_shot = synth.engines.vocoder.waveform(synth.frames(latents))
        assert streamed.shape == one_shot.shape
        assert np.max(np.abs(streamed - one_shot)) <= 1e-3
        assert len(pieces) == len(list(synth.plan(latents.shape[2], schedule)))


def test_short_sentence_is_shorter_than_one_window(synth: Synthesizer) -> None:
    (sentence,) = synth.sentences("Hi.")
    frames = synth.latents(sentence.ids, DETERMINISTIC).shape[2]
    assert frames < 128  # the default max window: "Hi." fits in one large window


def test_first_chunk_is_the_first_window(synth: Synthesizer) -> None:
    schedule = WindowSchedule(first=8, growth=2.0, max=128)
    first = next(iter(synth.stream(SENTENCES[0], DETERMINISTIC, schedule)))
    assert first.offset == 0
    assert len(first.samples) == 8 * synth.hop


def test_stream_pcm_equals_whole_synthesis(synth: Synthesizer) -> None:
    text = "First sentence here. And a second one!"
    chunks = list(synth.stream(text, DETERMINISTIC))
    streamed = np.concatenate([c.samples for c in chunks])
    whole = synth.synthesize(text, DETERMINISTIC)
    assert streamed.shape == whole.shape
    assert np.max(np.abs(streamed.astype(np.int32) - whole.astype(np.int32))) <= 33  # 1e-3 FS
    offsets = [c.offset for c in chunks]
    assert offsets == sorted(offsets)
    assert [c.last for c in chunks].count(True) == 1 and chunks[-1].last
    assert {c.sentence for c in chunks} == {0, 1}
    for a, b in itertools.pairwise(chunks):
        assert b.offset == a.offset + len(a.samples)


def test_audio_is_finite_unclipped_and_audible(synth: Synthesizer) -> None:
    for text in SENTENCES:
        for sentence in synth.sentences(text):
            audio = synth.one_shot(sentence.ids, SynthesisParams())
            assert np.all(np.isfinite(audio))
            assert np.max(np.abs(audio)) < 1.0  # nothing clipped by the PCM16 conversion
            pcm = to_pcm16(audio)
            assert np.sqrt(np.mean(pcm.astype(np.float64) ** 2)) > 300  # well above silence


def test_duration_is_monotone_in_speed(synth: Synthesizer) -> None:
    text = "Duration should follow the speaking rate."
    lengths = [
        len(synth.synthesize(text, SynthesisParams(speed=s, noise_scale=0.0, noise_w=0.0)))
        for s in (0.5, 0.8, 1.0, 1.5, 2.5)
    ]
    assert lengths == sorted(lengths, reverse=True)
    assert lengths[0] > 1.5 * lengths[2] and lengths[2] > 1.5 * lengths[-1]


def test_noise_makes_renditions_differ_and_zero_noise_repeats(synth: Synthesizer) -> None:
    text = "Say it again."
    a = synth.synthesize(text, DETERMINISTIC)
    b = synth.synthesize(text, DETERMINISTIC)
    assert np.array_equal(a, b)
    c = synth.synthesize(text, SynthesisParams(noise_scale=0.667, noise_w=0.0))
    d = synth.synthesize(text, SynthesisParams(noise_scale=0.667, noise_w=0.0))
    assert not np.array_equal(c, d)


def test_sentence_silence_is_inserted(synth: Synthesizer) -> None:
    text = "One. Two."
    base = synth.synthesize(text, SynthesisParams(noise_scale=0, noise_w=0, sentence_silence=0))
    longer = synth.synthesize(text, SynthesisParams(noise_scale=0, noise_w=0, sentence_silence=1))
    assert len(longer) - len(base) == synth.sample_rate


@pytest.mark.parametrize(
    "field,value",
    [("speed", 0.0), ("speed", 10.0), ("noise_scale", -1.0), ("noise_w", 3.0),
     ("sentence_silence", -0.1)],
)  # fmt: skip
def test_parameters_are_range_checked(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        SynthesisParams(**{field: value})


TORTURE = {
    "empty": "",
    "whitespace": " \t\n  ",
    "emoji only": "😀🎉👍",
    "control characters": "\x00\x07abc\x1b[31m def\x7f",
    "one character": "a",
    "digits and currency": "$1,234.56 and €7 for 3/4 of 99.9% at 12:00",
    "mixed scripts": "Hello мир 世界 مرحبا",
    "text..": "text..",
    "?!": "?!",
    "symbols only": "$$$ %%% ***",
    "zero width": "\u200b\u200d\ufeff",
    "combining marks": "e\u0301\u0301\u0301 cafe\u0301",
    "long": ("All work and no play makes Jack a dull boy, " * 120)[:5000],
}


@pytest.mark.parametrize("text", TORTURE.values(), ids=TORTURE.keys())
def test_torture_gives_audio_or_typed_error(text: str, synth: Synthesizer) -> None:
    try:
        chunks = list(synth.stream(text, DETERMINISTIC))
    except (NothingToSay, UnsupportedScript) as exc:  # mixed scripts: not English letters
        assert exc.status == 422 and exc.field == "text"
        return
    pcm = np.concatenate([c.samples for c in chunks])
    assert len(pcm) > 0
    assert chunks[-1].last


def test_calibrated_stream_still_equals_one_shot(synth: Synthesizer) -> None:
    text = "A calibrated synthesizer picks its own window sizes, exactly."
    try:
        assert synth.calibrate() > 0
        streamed = np.concatenate([c.samples for c in synth.stream(text, DETERMINISTIC)])
    finally:
        synth.frame_cost_s = 0.0  # the session-wide fixture stays uncalibrated
    whole = synth.synthesize(text, DETERMINISTIC)
    assert np.max(np.abs(streamed.astype(np.int32) - whole.astype(np.int32))) <= 33


def test_budgeted_stream_still_equals_one_shot(synth: Synthesizer) -> None:
    text = "Another stream is waiting, so my windows stay small, and exact."
    try:
        assert synth.calibrate() > 0
        streamed = np.concatenate(
            [c.samples for c in synth.stream(text, DETERMINISTIC, budget=lambda: 0.0)]
        )
    finally:
        synth.frame_cost_s = 0.0
    whole = synth.synthesize(text, DETERMINISTIC)
    assert np.max(np.abs(streamed.astype(np.int32) - whole.astype(np.int32))) <= 33


def test_audio_cap_refuses_before_any_audio_from_the_estimate(synth: Synthesizer) -> None:
    params = SynthesisParams(noise_scale=0.0, noise_w=0.0)
    text = "1234567890 " * 10
    whole = len(synth.synthesize(text, params)) / synth.sample_rate
    per_id = synth.seconds_per_id()
    assert 0.02 <= per_id <= 0.03  # measured on the canary
    chunks = synth.stream(text, params, max_audio_s=whole / 2)
    with pytest.raises(AudioTooLong, match="would make about"):
        next(chunks)  # the very first step: nothing was produced
    slow = synth.stream(text, SynthesisParams(speed=0.5, noise_scale=0.0, noise_w=0.0),
                        max_audio_s=whole * 1.5)  # fmt: skip
    with pytest.raises(AudioTooLong):
        next(slow)  # half the speed, twice the audio
    assert sum(len(c.samples) for c in synth.stream(text, params, max_audio_s=whole * 1.6)) == (
        len(synth.synthesize(text, params))
    )


def test_audio_cap_stops_a_stream_before_the_sentence_that_would_pass_it(
    synth: Synthesizer,
) -> None:
    params = SynthesisParams(noise_scale=0.0, noise_w=0.0)
    text = "Yes. " * 12
    whole = len(synth.synthesize(text, params)) / synth.sample_rate
    cap = whole * 0.7
    # a fault injected: an estimate far too low, as for a text nobody measured, lets the text
    # past the up-front check, so only the stop before each sentence can hold the cap
    measured = synth.seconds_per_id()
    synth._seconds_per_id = measured / 10
    sent = 0
    try:
        with pytest.raises(AudioTooLong, match="would pass"):
            for chunk in synth.stream(text, params, max_audio_s=cap):
                sent += len(chunk.samples)
    finally:
        synth._seconds_per_id = measured
    assert 0 < sent <= cap * synth.sample_rate


# --- multi-speaker voices (the derived voice of tests/speakers.py) ---------------------------

SPEAKER_SCHEDULES = [SCHEDULES[0], SCHEDULES[4], WindowSchedule()]


@pytest.mark.parametrize("schedule", SPEAKER_SCHEDULES, ids=str)
@pytest.mark.parametrize("speaker", [1, 2])
def test_a_speakers_stream_equals_the_unsplit_multi_speaker_graph(
    speaker: int, schedule: WindowSchedule, multi_speaker_synth: Synthesizer,
    multi_speaker_graph: ort.InferenceSession,
) -> None:  # fmt: skip
    synth = multi_speaker_synth
    params = SynthesisParams(noise_scale=0.0, noise_w=0.0, speaker=speaker)
    for text in SENTENCES[:3]:
        for sentence in synth.sentences(text):
            expected = run_piper(multi_speaker_graph, sentence.ids, [0.0, 1.0, 0.0], speaker)
            latents = synth.latents(sentence.ids, params)
            streamed = np.concatenate(list(synth.windows(latents, schedule, speaker)))
            assert streamed.shape == expected.shape
            assert np.max(np.abs(streamed - expected)) <= 1e-3


def test_speakers_differ_and_speaker_0_is_the_original_voice(
    multi_speaker_synth: Synthesizer, synth: Synthesizer
) -> None:
    text = "Is this the right way to the station?"
    voices = [
        np.concatenate([c.samples for c in multi_speaker_synth.stream(
            text, SynthesisParams(noise_scale=0.0, noise_w=0.0, speaker=speaker))])
        for speaker in (None, 0, 1, 2)
    ]  # fmt: skip
    original = np.concatenate([c.samples for c in synth.stream(text, DETERMINISTIC)])
    assert np.array_equal(voices[0], voices[1])  # no speaker is speaker 0
    assert voices[1].shape == original.shape
    assert np.max(np.abs(voices[1].astype(np.int32) - original)) <= 33  # 1e-3 FS
    for other in voices[2:]:
        n = min(len(other), len(original))
        # another pace or another timbre: far more than rounding apart, yet still speech
        assert len(other) != len(original) or np.sqrt(
            np.mean((other[:n].astype(np.float64) - original[:n]) ** 2)) > 300  # fmt: skip
        assert np.sqrt(np.mean(other.astype(np.float64) ** 2)) > 300
    assert not np.array_equal(voices[2], voices[3])


def test_a_speaker_streams_as_it_synthesizes_whole(multi_speaker_synth: Synthesizer) -> None:
    params = SynthesisParams(noise_scale=0.0, noise_w=0.0, speaker=2)
    text = "First sentence here. And a second one!"
    streamed = np.concatenate([c.samples for c in multi_speaker_synth.stream(text, params)])
    whole = multi_speaker_synth.synthesize(text, params)
    assert streamed.shape == whole.shape
    assert np.max(np.abs(streamed.astype(np.int32) - whole.astype(np.int32))) <= 33


def test_a_speaker_the_voice_lacks_is_refused_before_any_audio(
    multi_speaker_synth: Synthesizer, synth: Synthesizer
) -> None:
    for engines, speaker, match in ((multi_speaker_synth, 3, "speakers 0 to 2"),
                                    (synth, 1, "single speaker")):  # fmt: skip
        chunks = engines.stream("Hello there.", SynthesisParams(speaker=speaker))
        with pytest.raises(InvalidParameter, match=match) as err:
            next(chunks)
        assert err.value.status == 422 and err.value.field == "speaker"
    with pytest.raises(ValueError, match="speaker"):
        SynthesisParams(speaker=-1)
