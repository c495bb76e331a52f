"""The worker's stream scheduler with the real engines: who goes next, how long a window may
take while other streams are playing, and that multiplexed audio is still exact."""

from __future__ import annotations

import gc
import time
import weakref
from dataclasses import replace

import numpy as np
import pytest

from ttsvc.backends.base import EngineSet
from ttsvc.protocol import AudioChunkMsg, FromWorker, StreamDone, SynthesisJob
from ttsvc.synthesis import SynthesisParams, Synthesizer
from ttsvc.windows import WindowSchedule
from ttsvc.worker.compute import StreamScheduler

TEXT = (
    "Your order has shipped and will arrive on Thursday between nine and noon; "
    "reply to this message to change the delivery window."
)


def job(uid: str, text: str = TEXT, key: str | None = None) -> SynthesisJob:
    return SynthesisJob(uid, text, 1.0, 0.0, 0.0, 0.2, key=key)


@pytest.fixture(scope="module")
def calibrated(engine_set: EngineSet) -> Synthesizer:
    """A synthesizer that knows its cost per frame, as a worker's does (budgets need it), with
    window budgets turned on (they are off by default)."""
    synth = Synthesizer(engine_set, WindowSchedule(budget_share=0.5))
    synth.calibrate()
    return synth


def run(scheduler: StreamScheduler) -> dict[str, list[bytes]]:
    """Step until every stream is done; the PCM each stream sent, chunk by chunk."""
    out: dict[str, list[bytes]] = {uid: [] for uid in scheduler.streams}
    done: list[str] = []

    def send(msg: FromWorker) -> None:
        if isinstance(msg, AudioChunkMsg):
            out[msg.uid].append(msg.pcm)
        elif isinstance(msg, StreamDone):
            done.append(msg.uid)
        else:
            raise AssertionError(f"unexpected {msg}")

    for _ in range(10_000):
        if not scheduler.streams:
            break
        scheduler.step(send)
    assert sorted(done) == sorted(out)
    return out


def test_a_lone_stream_has_no_budget(calibrated: Synthesizer) -> None:
    scheduler = StreamScheduler(calibrated)
    scheduler.add(job("a"))
    assert scheduler._budget(scheduler.streams["a"]) is None


def test_budget_is_a_share_of_the_most_pressed_playing_stream(calibrated: Synthesizer) -> None:
    scheduler = StreamScheduler(calibrated)
    for uid in ("a", "b", "c", "fresh"):
        scheduler.add(job(uid))
    now = time.monotonic()
    rate = calibrated.sample_rate
    b, c = scheduler.streams["b"], scheduler.streams["c"]
    b.first_sent_at, b.samples_sent = now, rate * 2  # 2 s buffered
    c.first_sent_at, c.samples_sent = now, rate  # 1 s buffered: the most pressed
    budget = scheduler._budget(scheduler.streams["a"])
    assert budget is not None
    assert 0.45 < budget <= 0.5  # half of c's second, less the time since ``now``
    c.first_sent_at = now - 5.0  # c ran dry long ago: nothing to save, it no longer counts
    budget = scheduler._budget(scheduler.streams["a"])
    assert budget is not None and 0.9 < budget <= 1.0


def test_budget_is_off_without_multiplexing_or_with_share_zero(
    calibrated: Synthesizer, engine_set: EngineSet
) -> None:
    off = Synthesizer(engine_set, replace(WindowSchedule(), budget_share=0.0))
    off.frame_cost_s = calibrated.frame_cost_s
    for scheduler in (StreamScheduler(calibrated, multiplex=False), StreamScheduler(off)):
        scheduler.add(job("a"))
        scheduler.add(job("b"))
        b = scheduler.streams["b"]
        b.first_sent_at, b.samples_sent = time.monotonic(), calibrated.sample_rate
        assert scheduler._budget(scheduler.streams["a"]) is None


def test_multiplexed_streams_are_exact_with_and_without_budgets(
    calibrated: Synthesizer, engine_set: EngineSet
) -> None:
    free = Synthesizer(engine_set, replace(WindowSchedule(), budget_share=0.0))
    free.frame_cost_s = calibrated.frame_cost_s
    chunks = {}
    for name, synth in (("budget", calibrated), ("free", free)):
        scheduler = StreamScheduler(synth)
        scheduler.add(job("a"))
        scheduler.add(job("b"))
        chunks[name] = run(scheduler)
    whole = calibrated.synthesize(TEXT, SynthesisParams(noise_scale=0.0, noise_w=0.0))
    for name, streams in chunks.items():
        for uid, pieces in streams.items():
            pcm = np.frombuffer(b"".join(pieces), dtype="<i2").astype(np.int32)
            assert len(pcm) == len(whole), (name, uid)
            assert np.max(np.abs(pcm - whole.astype(np.int32))) <= 33, (name, uid)


@pytest.mark.parametrize("keyed", [True, False])
def test_keys_take_turns_before_deadlines(calibrated: Synthesizer, keyed: bool) -> None:
    """Three streams of one key that are far behind real time (as on an overloaded worker) and
    one stream of another key that is not: deadlines alone give every step to the late ones;
    with keys, the other key gets about every other step."""
    scheduler = StreamScheduler(calibrated)
    for uid in ("f1", "f2", "f3"):
        scheduler.add(job(uid, key="flood" if keyed else None))
    scheduler.add(job("q", key="quiet" if keyed else None))
    now, rate = time.monotonic(), calibrated.sample_rate
    for stream in scheduler.streams.values():  # all playing: no fresh-first step
        late = stream.job.uid != "q"
        stream.first_sent_at, stream.samples_sent = now - (30.0 if late else 0.0), rate
    steps: list[str] = []

    def send(msg: FromWorker) -> None:
        if isinstance(msg, AudioChunkMsg):
            steps.append(msg.uid)

    for _ in range(8):
        scheduler.step(send)
    if keyed:
        assert 2 <= steps.count("q") <= 6, steps
    else:
        assert "q" not in steps, steps  # the order without keys is unchanged


@pytest.mark.parametrize("end", ["done", "cancelled"])
def test_a_stream_that_ends_frees_its_engines_at_once(engine_set: EngineSet, end: str) -> None:
    """After a swap, the replaced synthesizer goes when its last stream ends, by reference
    counting: a worker must not keep an engine set resident until the cyclic collector runs."""
    old = Synthesizer(engine_set)
    scheduler = StreamScheduler(old)
    scheduler.add(job("a"))
    gone = weakref.ref(old)
    gc.disable()
    try:
        scheduler.step(lambda _msg: None)  # the stream is running on ``old``
        scheduler.synth = Synthesizer(engine_set)  # the swap
        del old
        if end == "done":
            run(scheduler)
        else:
            assert scheduler.cancel("a") is not None
        assert not scheduler.streams
        assert gone() is None
    finally:
        gc.enable()
