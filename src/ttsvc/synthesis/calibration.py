"""What a synthesizer's engines cost on this machine: per frame, per call, per phoneme id, and
how much audio a phoneme id makes.

Why a module of its own: the window schedule caps windows to playback from these figures and
the worker's scheduler prices every step with them (``worker.costs``), but measuring them is
not synthesis: each is a few timed engine calls on the canary sentence or on silent windows,
run once when a worker starts (and again for a voice it loads).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Protocol

import numpy as np

from ttsvc.backends.base import EngineSet, FloatArray, StreamCarry, StreamingEngine
from ttsvc.repository.manifest import FrameContext
from ttsvc.synthesis.canary import CANARY_TEXT
from ttsvc.synthesis.params import SynthesisParams
from ttsvc.text.frontend import Sentence

DETERMINISTIC = SynthesisParams(noise_scale=0.0, noise_w=0.0)


class Measured(Protocol):
    """What calibration reads of a synthesizer and the figures it sets on it (the synthesizer
    imports this module, so it is described, not imported)."""

    engines: EngineSet
    stateful: bool
    vocoder_context: FrameContext
    hop: int
    frame_cost_s: float
    flow_cost_s: float
    vocoder_cost_s: float
    acoustic_cost_s: float
    flow_call_s: float
    vocoder_call_s: float
    whole_costs: dict[str, tuple[float, float]]

    @property
    def sample_rate(self) -> int: ...

    def sentences(self, text: str) -> list[Sentence]: ...

    def latents(self, ids: tuple[int, ...] | list[int], params: SynthesisParams) -> FloatArray: ...

    def frames(self, latents: FloatArray, speaker: int = 0) -> FloatArray: ...


def calibrate(synth: Measured, frames: int = 64) -> float:
    """Measure flow + vocoder cost per frame (after a warm-up run) for the playback cap, and
    each engine's own cost (per frame, per phoneme id) for a worker's step estimates; set them
    on ``synth`` and return the cost per frame."""
    channels = synth.engines.manifest.latent_channels
    if synth.stateful:
        costs = _calibrate_calls(synth, channels, frames)
    else:
        costs = _calibrate_windows(synth, channels, frames)
    ids = [i for sentence in synth.sentences(CANARY_TEXT) for i in sentence.ids]
    started = time.perf_counter()
    synth.latents(ids, DETERMINISTIC)
    synth.acoustic_cost_s = (time.perf_counter() - started) / len(ids)
    synth.flow_cost_s = costs[0] if synth.engines.flow is not None else 0.0
    synth.vocoder_cost_s = costs[1]
    synth.frame_cost_s = sum(costs)
    _calibrate_whole(synth, channels)
    return synth.frame_cost_s


def _calibrate_windows(synth: Measured, channels: int, frames: int) -> list[float]:
    """Context engines: seconds per frame of a window of ``frames`` and its context."""
    width = frames + synth.vocoder_context.left + synth.vocoder_context.right
    window = np.zeros((1, channels, width), dtype=np.float32)
    costs = []
    for stage in (synth.frames, synth.engines.vocoder.waveform):
        stage(window)
        started = time.perf_counter()
        stage(window)
        costs.append((time.perf_counter() - started) / width)
    return costs


def _calibrate_calls(synth: Measured, channels: int, frames: int,
                     small: int = 4) -> list[float]:  # fmt: skip
    """Stateful engines: seconds per frame, and per call beside (``flow_call_s``,
    ``vocoder_call_s``), from calls of ``small`` and ``frames`` frames mid-sentence."""
    costs = []
    for stage in (synth.engines.flow, synth.engines.vocoder):
        if stage is None:
            costs.append(0.0)
            continue
        assert isinstance(stage, StreamingEngine)
        per_frame, call = _per_frame(partial(_mid_sentence, stage), channels, small, frames)
        if stage is synth.engines.flow:
            synth.flow_call_s = call
        else:
            synth.vocoder_call_s = call
        costs.append(per_frame)
    return costs


def _mid_sentence(engine: StreamingEngine, window: FloatArray) -> FloatArray:
    """A stateful call on ``window`` far inside a long sentence (no mask, no flush)."""
    return engine.step(window, StreamCarry(total=1 << 30, position=1 << 20))


def _calibrate_whole(synth: Measured, channels: int, small: int = 32,
                     large: int = 160) -> None:  # fmt: skip
    """The plain graphs' cost per frame and per call, by stage (``whole_costs``), from
    sentences of ``small`` and ``large`` frames (a short sentence is about 200)."""
    plain = synth.engines.one_shot
    if plain is None:
        return
    costs = {"vocoder": _per_frame(plain.vocoder.waveform, channels, small, large)}
    if plain.flow is not None:
        costs["flow"] = _per_frame(plain.flow.frames, channels, small, large)
    synth.whole_costs = costs


def _per_frame(run: Callable[[FloatArray], object], channels: int, small: int,
               large: int) -> tuple[float, float]:  # fmt: skip
    """``run``'s seconds per frame and per call beside, from calls of ``small`` and ``large``
    silent frames (the best of three each after a warm-up: a neighbour's load only adds)."""
    timings = []
    for width in (small, large):
        window = np.zeros((1, channels, width), dtype=np.float32)
        best = float("inf")
        for _ in range(4):  # the first warms the engine up
            started = time.perf_counter()
            run(window)
            best = min(best, time.perf_counter() - started)
        timings.append(best)
    per_frame = max(timings[1] - timings[0], 1e-9) / (large - small)
    return per_frame, max(0.0, timings[0] - small * per_frame)


def measure_seconds_per_id(synth: Measured) -> float:
    """Audio seconds per phoneme id at speed 1 of ``synth``'s voice, from the canary sentence's
    acoustic runs."""
    ids = frames = 0
    for sentence in synth.sentences(CANARY_TEXT):
        ids += len(sentence.ids)
        frames += synth.latents(sentence.ids, DETERMINISTIC).shape[2]
    return frames * synth.hop / synth.sample_rate / max(1, ids)
