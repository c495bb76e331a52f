"""Batching frame windows across streams: one engine call serves several streams (GPU workers).

On a GPU a batch of 8 windows costs little more than one, so a worker that runs each stream's
window alone wastes most of the device. Batching is an option of the worker's one scheduler
(``worker.deadline``), not a scheduler of its own: the stream its policy picks is always served
first, and the next ready streams in the same order whose pending call has the same shape
(``batch_key``: same engine set, stage, input shape and speaker) ride along in one call, up to
the engines' ``max_batch`` (``DeadlinePolicy.riders``). Calls of equal shape only, because
padding a window would change its output near the sentence end (the vocoder has no frame mask).

Where it pays is measured, not assumed (``benchmarks/engine_bench.py --batches``): on a CPU a
stateful vocoder window costs the same per frame at batch 1, 2, 4 and 8 (the convolutions
already fill a core), so CPU engine sets report a limit of 1 and their steps stay single calls.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from ttsvc.backends.base import (
    BatchFlowEngine,
    BatchVocoderEngine,
    EngineSet,
    FloatArray,
    StreamingEngine,
)
from ttsvc.errors import EngineError
from ttsvc.synthesis import FrameCall, Synthesizer

MAX_BATCH = 64
"""The most streams a worker's step serves at once; below it each engine set's own limit
(``batch_limit``: its ``max_batch``, 1 for engines that do not batch) decides, so a worker that
swaps CPU engines for plans that batch starts batching without a restart."""


def batch_limit(engines: EngineSet) -> int:
    """How many windows one call of ``engines`` may carry (1: it does not batch).

    Stateful engines do not batch: their states would have to be gathered and scattered per
    stream, and each stream's position and sentence length would have to be a row of its own,
    which only a device that batches would pay for (measured: ``worker/batching.py``'s module
    docstring; not built yet: docs/gpu.md)."""
    if isinstance(engines.vocoder, StreamingEngine):
        return 1
    flow_ok = engines.flow is None or isinstance(engines.flow, BatchFlowEngine)
    if not flow_ok or not isinstance(engines.vocoder, BatchVocoderEngine):
        return 1
    return max(1, engines.manifest.max_batch)


def batch_key(call: FrameCall, synth: Synthesizer) -> Hashable:
    """Calls with equal keys can run as one batch: same engines, stage, input shape, speaker.
    An acoustic call never batches (its shape is its sentence's own, and it runs once per
    sentence), so it gets a key no other call shares."""
    if call.stage == "acoustic":
        return ("acoustic", id(call))
    engines = call.engines or synth.engines
    return (id(engines), call.stage, call.inputs.shape, call.speaker)


def run_batch(engines: EngineSet, calls: Sequence[FrameCall]) -> list[FloatArray]:
    """Run equal-shaped calls of one stage as one batched engine call; answers in call order."""
    if any(call.speaker for call in calls):  # the batch protocols carry no speaker ids
        raise EngineError("batched engines are single-speaker: cannot run a speaker's windows")
    stacked = np.concatenate([call.inputs for call in calls], axis=0)
    if calls[0].stage == "flow":
        assert isinstance(engines.flow, BatchFlowEngine)
        frames = engines.flow.frames_batch(stacked)
        return [frames[i : i + 1] for i in range(len(calls))]
    assert isinstance(engines.vocoder, BatchVocoderEngine)
    samples = engines.vocoder.waveform_batch(stacked)
    return [samples[i] for i in range(len(calls))]
