"""Batching windows across streams as an option of the one scheduler: which streams ride along
with the picked one (fake clock, no engine run), and steps that run real engines as a batch
(ONNX Runtime standing in for the GPU plans) producing exactly the unbatched audio."""

from __future__ import annotations

import numpy as np
import pytest

from tests.worker.fakes import FakeGpuBatchVocoder, fake_gpu_batch_engines
from tests.worker.test_deadline import FakeClock, run_all
from ttsvc.protocol import AudioChunkMsg, FromWorker, StreamDone, StreamError, SynthesisJob
from ttsvc.synthesis import FrameCall, SynthesisParams, Synthesizer
from ttsvc.worker.batching import batch_key, batch_limit
from ttsvc.worker.deadline import DeadlineScheduler
from ttsvc.worker.deadline_policy import Live

TEXT = "The quick brown fox jumps over the lazy dog, and the dog sleeps on."
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Is this the right way to the station?",
    "A rainbow is a division of white light into many beautiful colors.",
    "Hello.",
]


def _job(uid: str, text: str = TEXT) -> SynthesisJob:
    return SynthesisJob(uid, text, 1.0, 0.0, 0.0, 0.2)


@pytest.fixture
def calls() -> list[tuple[str, int]]:
    return []


@pytest.fixture
def batch_synth(context_synth: Synthesizer, calls: list[tuple[str, int]]) -> Synthesizer:
    """Context engines: what TensorRT plans are (stateful engines do not batch). Not
    calibrated: without per-frame costs no cap depends on timing, so streams of one text plan
    the same windows."""
    return Synthesizer(fake_gpu_batch_engines(context_synth.engines, 4, calls))


def _sched(synth: Synthesizer, clock: FakeClock | None = None, max_batch: int = 4,
           threads: int = 1) -> DeadlineScheduler:  # fmt: skip
    return DeadlineScheduler(synth, threads, 0.9, 10.0, clock=clock or FakeClock(),
                             first_chunk_s=0.05, step_floor_s=10.0,
                             max_batch=max_batch)  # fmt: skip


def _playing(sched: DeadlineScheduler, uid: str, buffered_s: float, width: int = 40,
             stage: str = "vocoder") -> Live:  # fmt: skip
    stream = sched.streams[uid]
    stream.first_sent_at = sched.clock() - 1.0
    stream.samples_sent = round((1.0 + buffered_s) * stream.synth.sample_rate)
    inputs = np.zeros((1, 192, width), np.float32)
    stream.pending = FrameCall(stage, inputs)  # type: ignore[arg-type]
    return stream


def test_engines_that_batch_say_so_and_the_cpu_engines_do_not(
    batch_synth: Synthesizer, synth: Synthesizer
) -> None:
    assert batch_limit(batch_synth.engines) == 4
    assert batch_limit(synth.engines) == 1  # stateful ONNX Runtime engines: one call each


def test_riders_share_the_picked_streams_call_shape_in_pick_order(
    batch_synth: Synthesizer,
) -> None:
    sched = _sched(batch_synth)
    for uid in ("a", "b", "c", "d", "e"):
        sched.add(_job(uid))
    _playing(sched, "a", 0.5)
    _playing(sched, "b", 2.0)
    _playing(sched, "c", 1.0)
    _playing(sched, "d", 0.7, width=41)  # another shape: never in a's batch
    _playing(sched, "e", 1.5, stage="flow")  # another stage, same shape
    head = sched.pick()
    assert head is sched.streams["a"]
    assert [s.job.uid for s in sched.riders(head)] == ["c", "b"]  # least laxity first
    sched.streams["c"].running = True  # taken by another thread: not a rider
    assert [s.job.uid for s in sched.riders(head)] == ["b"]


def test_never_more_than_max_batch_or_the_engines_limit(batch_synth: Synthesizer) -> None:
    for max_batch, expected in ((8, 3), (3, 2), (1, 0)):  # the engines take 4 windows a call
        sched = _sched(batch_synth, max_batch=max_batch)
        for i in range(10):
            sched.add(_job(f"s{i}"))
            _playing(sched, f"s{i}", 0.5 + i / 10)
        head = sched.pick()
        assert head is not None
        assert len(sched.riders(head)) == expected


def test_nothing_rides_on_engines_that_do_not_batch_nor_with_a_fresh_stream(
    synth: Synthesizer, batch_synth: Synthesizer
) -> None:
    cpu = _sched(synth, max_batch=8)  # a scheduler told to batch, on engines that cannot
    for uid in ("a", "b"):
        cpu.add(_job(uid))
        _playing(cpu, uid, 1.0)
    assert cpu.riders(cpu.streams["a"]) == []
    fresh = _sched(batch_synth)
    for uid in ("new", "b"):
        fresh.add(_job(uid))
    _playing(fresh, "b", 1.0)
    assert fresh.pick() is fresh.streams["new"]  # its front end and acoustic run: alone
    assert fresh.riders(fresh.streams["new"]) == []


def test_acoustic_calls_never_batch(batch_synth: Synthesizer) -> None:
    ids = np.zeros((1, 12), np.int64)
    one, two = FrameCall("acoustic", ids), FrameCall("acoustic", ids.copy())
    assert batch_key(one, batch_synth) != batch_key(two, batch_synth)
    window = np.zeros((1, 192, 40), np.float32)
    assert batch_key(FrameCall("vocoder", window), batch_synth) == batch_key(
        FrameCall("vocoder", window.copy()), batch_synth)  # fmt: skip


def _drive(sched: DeadlineScheduler) -> tuple[list[FromWorker], list[int]]:
    """Run the streams to their end as a compute thread does (``DeadlineScheduler.run``), on
    this thread: take a step's streams, step; what was sent, and each step's batch size."""
    sent: list[FromWorker] = []
    sizes: list[int] = []
    for _ in range(10_000):
        with sched.lock:
            taken = sched.take()
        if taken is None:
            break
        head, riders = taken
        sizes.append(1 + len(riders))
        sched.step(head, sent.append, riders)
    assert not sched.streams
    return sent, sizes


def _pcm(sent: list[FromWorker], uid: str) -> np.ndarray:
    chunks = [m.pcm for m in sent if isinstance(m, AudioChunkMsg) and m.uid == uid]
    return np.frombuffer(b"".join(chunks), dtype="<i2")


def test_batched_streams_equal_unbatched_audio(
    batch_synth: Synthesizer, context_synth: Synthesizer, calls: list[tuple[str, int]]
) -> None:
    sched = _sched(batch_synth)
    jobs = [_job(f"u{i}") for i in range(4)] + [_job(f"t{i}", t) for i, t in enumerate(TEXTS)]
    for job in jobs:
        sched.add(job)
    sent, sizes = _drive(sched)
    params = SynthesisParams(noise_scale=0.0, noise_w=0.0)
    for job in jobs:
        expected = np.concatenate([c.samples for c in context_synth.stream(job.text, params)])
        got = _pcm(sent, job.uid)
        assert got.shape == expected.shape
        assert int(np.max(np.abs(got.astype(np.int32) - expected))) <= 1  # batch rounding
        finals = [m for m in sent if isinstance(m, StreamDone | StreamError) and m.uid == job.uid]
        assert len(finals) == 1 and isinstance(finals[0], StreamDone)
    assert max(sizes) > 1  # windows of several streams really shared calls
    assert max(size for _, size in calls) == max(sizes) <= 4
    assert sched.capacity.value > 0  # a batch's audio and time count too


def test_first_chunks_of_fresh_streams_go_before_any_second_chunk(
    batch_synth: Synthesizer,
) -> None:
    sched = _sched(batch_synth)
    jobs = [_job(f"u{i}") for i in range(4)]
    for job in jobs:
        sched.add(job)
    sent, sizes = _drive(sched)
    order = [m.uid for m in sent if isinstance(m, AudioChunkMsg)]
    firsts = [order.index(job.uid) for job in jobs]
    seconds = [i for i, uid in enumerate(order) if order[:i].count(uid) == 1]
    assert max(firsts) < min(seconds)
    assert sizes[:4] == [1, 1, 1, 1] and sizes[4] == 4  # first chunks alone, then one batch


def test_a_failing_batch_fails_its_streams_not_the_worker(batch_synth: Synthesizer) -> None:
    vocoder = batch_synth.engines.vocoder
    assert isinstance(vocoder, FakeGpuBatchVocoder)
    sched = _sched(batch_synth)
    for uid in ("f0", "f1"):
        sched.add(_job(uid))
    sched.add(_job("alone", TEXTS[3]))  # "Hello.": windows of its own shape
    first: list[FromWorker] = []
    for uid in ("f0", "f1", "alone"):  # their first chunks, one step each
        stream = sched.streams[uid]
        stream.running = True
        sched.step(stream, first.append)
    vocoder.fail = True  # the device fails from now on: in a batch and alone
    sent, sizes = _drive(sched)
    assert 2 in sizes  # f0 and f1's next windows shared a call, which failed
    errors = [m for m in sent if isinstance(m, StreamError)]
    assert sorted(e.uid for e in errors) == ["alone", "f0", "f1"]  # one final message each
    assert all(e.status == 500 and e.type == "internal_error" for e in errors)
    vocoder.fail = False
    sched.add(_job("ok", TEXTS[3]))
    sent, _ = _drive(sched)
    assert isinstance(sent[-1], StreamDone) and len(_pcm(sent, "ok")) > 0


def test_a_stream_with_nothing_to_say_fails_alone(batch_synth: Synthesizer) -> None:
    sched = _sched(batch_synth)
    sched.add(_job("empty", "   "))
    sched.add(_job("fine", TEXTS[3]))
    sent, _ = _drive(sched)
    errors = [m for m in sent if isinstance(m, StreamError)]
    assert [(e.uid, e.status) for e in errors] == [("empty", 422)]
    assert isinstance(sent[-1], StreamDone) and sent[-1].uid == "fine"


def test_the_threads_batch_too(batch_synth: Synthesizer, calls: list[tuple[str, int]]) -> None:
    """The scheduler's own threads (``run``) take riders as ``_drive`` does: on a clock that
    stands still, four streams of one text queued together send their first chunks one by one,
    then ride together."""
    jobs = [_job(f"u{i}") for i in range(4)]
    out = run_all(_sched(batch_synth), jobs, queued=True)
    assert all(isinstance(out[j.uid][-1], StreamDone) for j in jobs)
    assert max(size for _, size in calls) == 4
