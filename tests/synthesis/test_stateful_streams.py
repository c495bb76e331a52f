"""Stateful engines in the synthesizer: each stream's state is its own, from start to end.

Many streams' windows interleaved on one engine set, in small and uneven steps, each equal to
its own one-shot audio; a stream closed mid-sentence leaves nothing behind and disturbs no
other; the two kinds of engines give the same audio.
"""

from __future__ import annotations

import gc
import itertools

import numpy as np

from ttsvc.backends.base import StreamCarry
from ttsvc.synthesis import SynthesisParams, Synthesizer
from ttsvc.synthesis.steps import AudioChunk, FrameCall, Steps
from ttsvc.windows import WindowSchedule

DETERMINISTIC = SynthesisParams(noise_scale=0.0, noise_w=0.0)
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Is this the right way to the station? I think it is.",
    "Press one for English, or two for Spanish.",
    "Hi.",
    "Your call is important to us, please stay on the line.",
]


def _interleave(synth: Synthesizer, streams: list[Steps[AudioChunk]],
                close_after: dict[int, int] | None = None) -> list[list[AudioChunk]]:  # fmt: skip
    """Advance every stream one engine call at a time, round robin, on one engine set;
    ``close_after``: stream index -> calls after which that stream is closed (a cancel)."""
    out: list[list[AudioChunk]] = [[] for _ in streams]
    answers: list[object] = [None] * len(streams)
    calls = [0] * len(streams)
    active = set(range(len(streams)))
    while active:
        for i in sorted(active):
            if close_after and calls[i] >= close_after.get(i, 1 << 30):
                streams[i].close()
                active.discard(i)
                continue
            try:
                item = streams[i].send(answers[i])  # type: ignore[arg-type]
            except StopIteration:
                active.discard(i)
                continue
            if isinstance(item, FrameCall):
                calls[i] += 1
                answers[i] = synth.run_call(item)
            else:
                answers[i] = None
                out[i].append(item)
    return out


def _pcm(chunks: list[AudioChunk]) -> np.ndarray:
    return np.concatenate([c.samples for c in chunks]).astype(np.int32)


def test_the_default_voice_compiles_to_stateful_engines(synth: Synthesizer) -> None:
    assert synth.stateful and synth.engines.manifest.streaming == "stateful"
    assert synth.vocoder_context.left == 0 and synth.flow_context is not None


def test_interleaved_streams_each_equal_their_own_one_shot(synth: Synthesizer) -> None:
    schedules = [WindowSchedule(first=1, growth=1.0, max=1), WindowSchedule(first=3, growth=1.5,
                 max=24), WindowSchedule(), WindowSchedule(first=2, growth=2.0, max=7),
                 WindowSchedule(first=5, growth=1.0, max=5)]  # fmt: skip
    streams = [synth.stream_steps(text, DETERMINISTIC, schedule)
               for text, schedule in zip(TEXTS, schedules, strict=True)]  # fmt: skip
    for text, chunks in zip(TEXTS, _interleave(synth, streams), strict=True):
        whole = synth.synthesize(text, DETERMINISTIC).astype(np.int32)
        streamed = _pcm(chunks)
        assert streamed.shape == whole.shape, text
        assert np.max(np.abs(streamed - whole)) <= 1, text  # float rounding: one PCM16 step


def _carries() -> int:
    gc.collect()
    return sum(isinstance(o, StreamCarry) for o in gc.get_objects())


def test_a_cancelled_stream_frees_its_state_and_disturbs_no_other(synth: Synthesizer) -> None:
    before = _carries()
    schedule = WindowSchedule(first=2, growth=1.5, max=16)
    streams = [synth.stream_steps(text, DETERMINISTIC, schedule) for text in TEXTS[:3]]
    out = _interleave(synth, streams, close_after={1: 4})
    assert out[1] and not out[1][-1].last  # cut mid-sentence
    for index in (0, 2):
        whole = synth.synthesize(TEXTS[index], DETERMINISTIC).astype(np.int32)
        assert np.max(np.abs(_pcm(out[index]) - whole)) <= 1
    del streams, out
    assert _carries() == before


def test_stateful_and_context_engines_say_the_same(
    synth: Synthesizer, context_synth: Synthesizer
) -> None:
    """The context engines are within their compile's 1e-5 of one-shot on the canaries and
    1e-3 on any sentence (``tests/synthesis/test_synthesizer.py``): so are both kinds of each
    other, and a swap between them changes nothing a listener hears."""
    assert not context_synth.stateful
    for text in TEXTS:
        a = np.concatenate([c.samples for c in synth.stream(text, DETERMINISTIC)])
        b = np.concatenate([c.samples for c in context_synth.stream(text, DETERMINISTIC)])
        assert a.shape == b.shape
        assert np.max(np.abs(a.astype(np.int32) - b.astype(np.int32))) <= 33  # 1e-3 of full


def test_fast_speech_is_as_short_as_asked_and_streams_as_one_shot(
    synth: Synthesizer, context_synth: Synthesizer
) -> None:
    """At speed 4 the speech is a quarter of speed 1's (pad ids may get no frame at all, every
    phoneme keeps one: ``compile/speed.py``), and both kinds of engines still stream it as they
    make it in one shot, word times included (the durations are the frames the audio was made
    of)."""
    text = TEXTS[0]
    fast = DETERMINISTIC.model_copy(update={"speed": 4.0})
    for engines in (synth, context_synth):
        assert engines.engines.manifest.speed_durations
        plain, whole = engines.synthesize(text, DETERMINISTIC), engines.synthesize(text, fast)
        frames = len(whole) // engines.hop, len(plain) // engines.hop
        assert abs(frames[0] - frames[1] / 4) <= 1, frames
        schedule = WindowSchedule(first=3, growth=1.5, max=24)
        chunks = _interleave(engines, [engines.stream_steps(text, fast, schedule)])[0]
        streamed = _pcm(chunks)
        assert streamed.shape == whole.shape
        assert np.max(np.abs(streamed - whole.astype(np.int32))) <= 1
    timed = list(synth.stream(text, fast.model_copy(update={"timestamps": True})))
    words = [w for c in timed for w in c.words]
    assert len(words) == len(text.split())
    assert all(a.start <= b.start for a, b in itertools.pairwise(words))
    assert words[-1].end <= sum(len(c.samples) for c in timed) / synth.sample_rate + 1e-6
