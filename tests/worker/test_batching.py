"""Batching windows across streams: the policy's order, and the scheduler on real engines
(ONNX Runtime standing in for the GPU plans) producing exactly the unbatched audio."""

from __future__ import annotations

import numpy as np
import pytest

from tests.worker.fakes import FakeGpuBatchVocoder, fake_gpu_batch_engines
from ttsvc.protocol import AudioChunkMsg, FromWorker, StreamDone, StreamError, SynthesisJob
from ttsvc.synthesis import SynthesisParams, Synthesizer
from ttsvc.worker.batching import (
    BatchStreamScheduler,
    PendingWindow,
    scheduler_for,
    select_batch,
)
from ttsvc.worker.compute import StreamScheduler

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Is this the right way to the station?",
    "Are you calling about an existing order?",
    "A rainbow is a division of white light into many beautiful colors.",
    "Hello.",
]


def _w(uid: str, key: str = "k", *, fresh: bool = False, arrived: float = 0.0,
       deadline: float = 0.0, limit: int = 8) -> PendingWindow:  # fmt: skip
    return PendingWindow(uid, key, fresh, arrived, deadline, limit)


def _uids(batch: list[PendingWindow]) -> list[str]:
    return [w.uid for w in batch]


def test_fresh_streams_first_oldest_first() -> None:
    pending = [_w("run", deadline=-5.0), _w("new2", fresh=True, arrived=2.0),
               _w("new1", fresh=True, arrived=1.0)]  # fmt: skip
    assert _uids(select_batch(pending, 8)) == ["new1", "new2", "run"]


def test_then_earliest_deadline() -> None:
    pending = [_w("late", deadline=3.0), _w("soon", deadline=1.0), _w("mid", deadline=2.0)]
    assert _uids(select_batch(pending, 8)) == ["soon", "mid", "late"]


def test_only_calls_of_the_head_shape_ride_along() -> None:
    pending = [_w("a", "x", deadline=1.0), _w("b", "y", deadline=2.0),
               _w("c", "x", deadline=3.0), _w("d", "y", fresh=True, arrived=9.0)]  # fmt: skip
    assert _uids(select_batch(pending, 8)) == ["d", "b"]  # the fresh one leads with its shape
    assert _uids(select_batch(pending[:3], 8)) == ["a", "c"]


def test_never_more_than_max_batch_or_the_engines_limit() -> None:
    pending = [_w(f"s{i}", deadline=float(i)) for i in range(20)]
    assert _uids(select_batch(pending, 8)) == [f"s{i}" for i in range(8)]
    assert _uids(select_batch(pending, 1)) == ["s0"]
    limited = [_w(f"s{i}", deadline=float(i), limit=3) for i in range(20)]
    assert len(select_batch(limited, 8)) == 3
    assert select_batch([], 8) == []


def test_no_stream_starves() -> None:
    """Twelve streams of three shapes, batches of at most 4: a served stream's deadline moves
    by the audio it got; every stream is served within a bounded number of steps, always."""
    deadlines = {f"s{i}": float(i % 5) for i in range(12)}
    shapes = {f"s{i}": f"shape{i % 3}" for i in range(12)}
    last_served = dict.fromkeys(deadlines, 0)
    worst_gap = 0
    for step in range(1, 400):
        pending = [_w(uid, shapes[uid], deadline=d) for uid, d in deadlines.items()]
        batch = select_batch(pending, 4)
        assert 1 <= len(batch) <= 4 and len({w.key for w in batch}) == 1
        for window in batch:
            deadlines[window.uid] += 1.5  # seconds of audio the window added
            worst_gap = max(worst_gap, step - last_served[window.uid])
            last_served[window.uid] = step
    assert all(step - served < 30 for served in last_served.values())
    assert worst_gap < 30


def _job(uid: str, text: str) -> SynthesisJob:
    return SynthesisJob(uid, text, 1.0, 0.0, 0.0, 0.2)


def _run(scheduler: StreamScheduler, jobs: list[SynthesisJob]) -> list[FromWorker]:
    sent: list[FromWorker] = []
    for job in jobs:
        scheduler.add(job)
    for _ in range(10_000):
        if not scheduler.streams:
            break
        scheduler.step(sent.append)
    assert not scheduler.streams
    return sent


def _pcm(sent: list[FromWorker], uid: str) -> np.ndarray:
    chunks = [m.pcm for m in sent if isinstance(m, AudioChunkMsg) and m.uid == uid]
    return np.frombuffer(b"".join(chunks), dtype="<i2")


@pytest.fixture
def calls() -> list[tuple[str, int]]:
    return []


@pytest.fixture
def batch_synth(context_synth: Synthesizer, calls: list[tuple[str, int]]) -> Synthesizer:
    """Context engines: what TensorRT plans are (stateful engines do not batch)."""
    return Synthesizer(fake_gpu_batch_engines(context_synth.engines, 4, calls))


def test_batched_streams_equal_unbatched_audio(
    batch_synth: Synthesizer, context_synth: Synthesizer, calls: list[tuple[str, int]]
) -> None:
    synth = context_synth
    scheduler = scheduler_for(batch_synth, multiplex=True)
    assert isinstance(scheduler, BatchStreamScheduler) and scheduler.max_batch == 4
    jobs = [_job(f"u{i}", text) for i, text in enumerate(TEXTS)]
    sent = _run(scheduler, jobs)
    params = SynthesisParams(noise_scale=0.0, noise_w=0.0)
    for job in jobs:
        expected = np.concatenate([c.samples for c in synth.stream(job.text, params)])
        got = _pcm(sent, job.uid)
        assert got.shape == expected.shape
        assert int(np.max(np.abs(got.astype(np.int32) - expected))) <= 1  # batch rounding
        finals = [m for m in sent if isinstance(m, StreamDone | StreamError) and m.uid == job.uid]
        assert len(finals) == 1 and isinstance(finals[0], StreamDone)
    assert max(scheduler.batch_sizes) > 1  # windows of several streams really shared calls
    assert max(size for _, size in calls) <= 4
    assert sum(scheduler.batch_sizes) > len(scheduler.batch_sizes)


def test_first_chunks_of_fresh_streams_go_before_any_second_chunk(
    batch_synth: Synthesizer,
) -> None:
    scheduler = BatchStreamScheduler(batch_synth, 4)
    jobs = [_job(f"u{i}", text) for i, text in enumerate(TEXTS[:4])]
    sent = _run(scheduler, jobs)
    order = [m.uid for m in sent if isinstance(m, AudioChunkMsg)]
    firsts = [order.index(job.uid) for job in jobs]
    seconds = [i for i, uid in enumerate(order) if order[: i].count(uid) == 1]
    assert max(firsts) < min(seconds)
    assert scheduler.batch_sizes[:2] == [4, 4]  # four first windows: flow, then vocoder, at once


def test_cpu_engines_keep_the_cpu_scheduler(synth: Synthesizer) -> None:
    scheduler = scheduler_for(synth, multiplex=True)
    assert type(scheduler) is StreamScheduler
    assert type(scheduler_for(synth, multiplex=False)) is StreamScheduler


def test_cpu_scheduler_order_is_unchanged(synth: Synthesizer) -> None:
    """Batch of one, fresh first then earliest deadline: every stream's first chunk before any
    second one, each stream's audio exactly its unmultiplexed audio."""
    scheduler = StreamScheduler(synth)
    jobs = [_job(f"c{i}", text) for i, text in enumerate(TEXTS[:3])]
    sent = _run(scheduler, jobs)
    order = [m.uid for m in sent if isinstance(m, AudioChunkMsg)]
    assert order[:3] == ["c0", "c1", "c2"]
    params = SynthesisParams(noise_scale=0.0, noise_w=0.0)
    for job in jobs:
        expected = np.concatenate([c.samples for c in synth.stream(job.text, params)])
        np.testing.assert_array_equal(_pcm(sent, job.uid), expected)


def test_a_failing_batch_fails_its_streams_not_the_worker(batch_synth: Synthesizer) -> None:
    vocoder = batch_synth.engines.vocoder
    assert isinstance(vocoder, FakeGpuBatchVocoder)
    scheduler = BatchStreamScheduler(batch_synth, 4)
    vocoder.fail = True
    sent = _run(scheduler, [_job("f0", TEXTS[0]), _job("f1", TEXTS[1])])
    errors = [m for m in sent if isinstance(m, StreamError)]
    assert sorted(e.uid for e in errors) == ["f0", "f1"]
    assert all(e.status == 500 and e.type == "internal_error" for e in errors)
    vocoder.fail = False
    sent = _run(scheduler, [_job("ok", TEXTS[4])])
    assert isinstance(sent[-1], StreamDone) and len(_pcm(sent, "ok")) > 0


def test_a_stream_with_nothing_to_say_fails_alone(batch_synth: Synthesizer) -> None:
    scheduler = BatchStreamScheduler(batch_synth, 4)
    sent = _run(scheduler, [_job("empty", "   "), _job("fine", TEXTS[4])])
    errors = [m for m in sent if isinstance(m, StreamError)]
    assert [(e.uid, e.status) for e in errors] == [("empty", 422)]
    assert isinstance(sent[-1], StreamDone) and sent[-1].uid == "fine"
