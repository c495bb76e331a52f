"""Whole sentences on the plain graphs (``frame_steps.whole_steps``): the audio streamed windows
make, in one chunk per sentence, from one plain flow call and one plain vocoder call each; asked
for by the stream's caller after each acoustic run, and never where the engines have no plain
graphs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ttsvc.synthesis import SynthesisParams, Synthesizer
from ttsvc.synthesis.steps import AudioChunk, FrameCall, drive

DETERMINISTIC = SynthesisParams(noise_scale=0.0, noise_w=0.0)
TEXT = "Your order has shipped. It will arrive on Thursday between nine and noon."


Run = tuple[list[AudioChunk], list[FrameCall]]


def _run(synth: Synthesizer, asked: list[float], answer: bool | list[bool], text: str = TEXT,
         params: SynthesisParams = DETERMINISTIC) -> Run:  # fmt: skip
    """The stream's chunks and engine calls, ``whole`` answering ``answer`` (one per sentence,
    or the same for all) and recording what it was asked with in ``asked``."""
    calls: list[FrameCall] = []
    answers = iter(answer) if isinstance(answer, list) else None

    def whole(cost: float) -> bool:
        asked.append(cost)
        return next(answers) if answers is not None else bool(answer)

    def run(call: FrameCall) -> object:
        calls.append(call)
        return synth.run_call(call)

    chunks = list(drive(synth.stream_steps(text, params, whole=whole), run))  # type: ignore[arg-type]
    return chunks, calls


def _pcm(chunks: list[AudioChunk]) -> np.ndarray:
    return np.concatenate([c.samples for c in chunks]).astype(np.int32)


@pytest.fixture(scope="module")
def calibrated(synth: Synthesizer) -> Synthesizer:
    fresh = Synthesizer(synth.engines)
    fresh.calibrate()
    return fresh


def test_whole_sentences_are_the_streamed_audio_one_chunk_each(calibrated: Synthesizer) -> None:
    asked: list[float] = []
    chunks, calls = _run(calibrated, asked, True)
    streamed = list(calibrated.stream(TEXT, DETERMINISTIC))
    assert len(chunks) == 2 < len(streamed)
    assert [(c.sentence, c.last) for c in chunks] == [(0, False), (1, True)]
    assert chunks[1].offset == len(chunks[0].samples)
    whole, windows = _pcm(chunks), _pcm(streamed)
    assert whole.shape == windows.shape
    assert np.max(np.abs(whole - windows)) <= 1  # float rounding: one PCM16 step
    # per sentence: its acoustic run, then one plain flow call and one plain vocoder call
    assert [(c.stage, c.plain) for c in calls] == [
        ("acoustic", False), ("flow", True), ("vocoder", True)] * 2  # fmt: skip
    assert all(c.carry is None for c in calls)
    # asked once a sentence, after its acoustic run, with what it costs whole here
    frames = [c.inputs.shape[2] for c in calls if c.stage == "flow"]
    assert asked == [calibrated.whole_cost(n) for n in frames]
    assert 0 < asked[0] < asked[1]  # the second sentence is the longer


def test_the_caller_chooses_per_sentence(calibrated: Synthesizer) -> None:
    chunks, calls = _run(calibrated, [], [False, True])
    assert [c.sentence for c in chunks].count(0) > 1  # the first streamed in windows
    assert [c.sentence for c in chunks].count(1) == 1  # the second whole
    assert any(c.carry is not None for c in calls)
    assert np.max(np.abs(_pcm(chunks) - _pcm(list(calibrated.stream(TEXT, DETERMINISTIC))))) <= 1


def test_no_whole_sentences_where_the_engines_have_no_plain_graphs(synth: Synthesizer) -> None:
    """A stateful version compiled before the plain graphs were: every sentence streams, and
    the caller is not asked."""
    old = Synthesizer(dataclasses.replace(synth.engines, plain=None))
    assert old.engines.one_shot is None
    asked: list[float] = []
    chunks, calls = _run(old, asked, True)
    assert asked == [] and len(chunks) > 2 and not any(c.plain for c in calls)


def test_context_engines_run_whole_sentences_on_their_own_graphs(
    context_synth: Synthesizer,
) -> None:
    chunks, calls = _run(context_synth, [], True)
    assert len(chunks) == 2 and all(c.plain for c in calls if c.stage != "acoustic")
    windows = _pcm(list(context_synth.stream(TEXT, DETERMINISTIC)))
    assert np.max(np.abs(_pcm(chunks) - windows)) <= 33  # context windows: 1e-3 of full scale


def test_a_speaker_reaches_the_plain_graphs(multi_speaker_synth: Synthesizer) -> None:
    for speaker in (1, 2):
        params = DETERMINISTIC.model_copy(update={"speaker": speaker})
        chunks, calls = _run(multi_speaker_synth, [], True, params=params)
        assert {c.speaker for c in calls} == {speaker}
        windows = _pcm(list(multi_speaker_synth.stream(TEXT, params)))
        assert np.max(np.abs(_pcm(chunks) - windows)) <= 1
