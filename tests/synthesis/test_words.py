"""Word timestamps agree with the audio: a word starts where its first phoneme's frames begin.

Exact where the frames can be read: with noise 0 the latents repeat each phoneme id's encoder
column for that id's frames, so the columns change exactly at the durations' running sum, and a
word's start must be one of those changes (to the frame). Against the samples: after a pause,
a word beginning with a vowel or a sonorant is heard from its first frame (a stop consonant's
closure is silent, so those are left out), so the audio's energy rises within two frames of it.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ttsvc.protocol import WordTime
from ttsvc.synthesis import AudioChunk, SynthesisParams, Synthesizer

PAUSED = "Anna, Emma, Olivia, Ella, Ava, Isla, Amelia."
"""Words after silence-bearing punctuation, each beginning with a sound heard from its start."""


def timed(synth: Synthesizer, text: str, **kw: object) -> list[AudioChunk]:
    params = SynthesisParams(noise_scale=0.0, noise_w=0.0, timestamps=True, **kw)  # type: ignore[arg-type]
    return list(synth.stream(text, params))


def test_each_word_starts_on_its_first_phonemes_frames(synth: Synthesizer) -> None:
    text = "It costs $12.50 today, of the people. Visit example.com at 10:30!"
    chunks = timed(synth, text, speed=1.3, sentence_silence=0.4)
    words = [w for c in chunks for w in c.words]
    params = SynthesisParams(noise_scale=0.0, noise_w=0.0, speed=1.3)
    frame_s = synth.hop / synth.sample_rate
    starts = [c.offset_s for i, c in enumerate(chunks)
              if i == 0 or c.sentence != chunks[i - 1].sentence]  # fmt: skip
    sentences = synth.frontend.sentences(text, words=True)
    assert len(starts) == len(sentences)
    seen = 0
    for sentence, base in zip(sentences, starts, strict=True):
        run = synth.engines.acoustic.run(np.asarray([sentence.ids]), params.scales(synth.engines))
        assert run.durations is not None
        z = run.latents[0]
        changes = {0} | {
            t for t in range(1, z.shape[1]) if not np.array_equal(z[:, t], z[:, t - 1])
        }
        bounds = np.concatenate([[0], np.cumsum(run.durations)])
        for word in sentence.words:
            got = words[seen]
            seen += 1
            first = int(bounds[word.ids[0]])
            assert first in changes  # where the word's first id's column begins in the latents
            assert got.start == pytest.approx(base + first * frame_s, abs=1e-9)
            assert got.end == pytest.approx(base + int(bounds[word.ids[1]]) * frame_s, abs=1e-9)
            assert (got.word, got.text_span) == (word.text, word.span)
    assert seen == len(words) == 16


def onsets(chunks: list[AudioChunk], hop: int, rate: int) -> list[tuple[WordTime, int, int]]:
    """Per word after a pause: its start frame and the first frame past the pause whose energy
    rises above a tenth of the loudest frame's."""
    audio = np.concatenate([c.samples for c in chunks]).astype(np.float64) / 32767
    words = [w for c in chunks for w in c.words]
    n = len(audio) // hop
    rms = np.sqrt(np.mean(audio[: n * hop].reshape(n, hop) ** 2, axis=1))
    quiet = 0.1 * rms.max()
    out = []
    for previous, word in itertools.pairwise(words):
        pause, start = round(previous.end * rate / hop), round(word.start * rate / hop)
        assert rms[pause:start].min() <= quiet, f"no pause before {word.word}"
        onset = pause
        while rms[onset] <= quiet:
            onset += 1
        out.append((word, start, onset))
    return out


@pytest.mark.parametrize("speed", [1.0, 1.6])
def test_word_starts_agree_with_the_audio_after_pauses(synth: Synthesizer, speed: float) -> None:
    found = onsets(timed(synth, PAUSED, speed=speed), synth.hop, synth.sample_rate)
    assert len(found) == 6
    errors = [onset - start for _, start, onset in found]
    assert max(abs(e) for e in errors) <= 2, errors


@pytest.mark.parametrize(("speed", "silence"), [(1.0, 0.2), (2.0, 0.0), (0.7, 1.5)])
def test_words_ride_the_chunk_they_start_in(synth: Synthesizer, speed: float,
                                            silence: float) -> None:  # fmt: skip
    """Each chunk carries the words whose start lies in its audio, its offset in seconds too;
    sentence silence and speed move the times with the audio."""
    chunks = timed(synth, "Red, green. Blue and yellow! Purple?", speed=speed,
                   sentence_silence=silence)  # fmt: skip
    rate = synth.sample_rate
    assert [w.word for c in chunks for w in c.words] == ["Red", "green", "Blue", "and", "yellow",
                                                         "Purple"]  # fmt: skip
    previous_end = 0.0
    for chunk in chunks:
        assert chunk.offset_s == pytest.approx(chunk.offset / rate)
        for word in chunk.words:
            assert chunk.offset_s <= word.start < chunk.offset_s + len(chunk.samples) / rate
            assert previous_end <= word.start < word.end
            previous_end = word.end
    total = sum(len(c.samples) for c in chunks) / rate
    assert previous_end <= total


def test_no_words_unless_asked(synth: Synthesizer) -> None:
    chunks = list(synth.stream("Red, green.", SynthesisParams(noise_scale=0.0, noise_w=0.0)))
    assert all(c.words == () for c in chunks)
