"""Every scheduler driven through the one interface the worker loop uses (``Scheduler``) as the
loop drives it: start, pump each turn, close. Each streams its jobs to one final message and
answers a cancel, whether the loop's thread runs its steps or threads of its own do."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from tests.worker.fakes import fake_gpu_batch_engines
from ttsvc.backends.base import EngineSet
from ttsvc.protocol import AudioChunkMsg, FromWorker, StreamDone, StreamError, SynthesisJob
from ttsvc.synthesis import SynthesisParams, Synthesizer
from ttsvc.worker.batching import BatchStreamScheduler
from ttsvc.worker.compute import StreamScheduler
from ttsvc.worker.deadline import DeadlineScheduler
from ttsvc.worker.scheduling import Scheduler

TEXT = "Your order has shipped. It will arrive on Thursday between nine and noon."
WAIT_S = 120.0
"""Longest a test waits for its streams (a busy two-core machine)."""


def job(uid: str, text: str = TEXT) -> SynthesisJob:
    return SynthesisJob(uid, text, 1.0, 0.0, 0.0, 0.2)


class Outbox:
    """The pipe to the gateway: what every thread sent, in order."""

    def __init__(self) -> None:
        self.sent: list[FromWorker] = []
        self._lock = threading.Lock()

    def __call__(self, msg: FromWorker) -> None:
        with self._lock:
            self.sent.append(msg)

    def of(self, uid: str) -> list[FromWorker]:
        with self._lock:
            return [m for m in self.sent if getattr(m, "uid", None) == uid]

    def ended(self, uid: str) -> bool:
        return any(isinstance(m, StreamDone | StreamError) for m in self.of(uid))


def turn(scheduler: Scheduler, send: Outbox, until: Callable[[], bool]) -> None:
    """The worker loop's turns (``WorkerLoop.run``), without the pipe, until ``until``."""
    deadline = time.monotonic() + WAIT_S
    while not until():
        assert time.monotonic() < deadline, "the streams never ended"
        scheduler.pump(send)
        if not scheduler.wants_turn():
            time.sleep(0.002)  # the loop would wait on its pipe here


@pytest.fixture(scope="module")
def calibrated(engine_set: EngineSet) -> Synthesizer:
    """A synthesizer that knows its costs, as a worker's does (the deadline policy needs them)."""
    synth = Synthesizer(engine_set)
    synth.calibrate()
    return synth


@pytest.fixture(params=["single-loop", "batching", "deadline"])
def scheduler(request: pytest.FixtureRequest) -> Iterator[tuple[Scheduler, Synthesizer]]:
    """Each scheduler the worker may run, and the synthesizer whose audio its streams carry."""
    chosen: Scheduler
    if request.param == "single-loop":
        synth: Synthesizer = request.getfixturevalue("synth")
        chosen = StreamScheduler(synth)
    elif request.param == "batching":
        synth = request.getfixturevalue("context_synth")  # context engines: what GPU plans are
        chosen = BatchStreamScheduler(Synthesizer(fake_gpu_batch_engines(synth.engines, 4, [])), 4)
    else:
        synth = request.getfixturevalue("calibrated")
        chosen = DeadlineScheduler(synth, threads=2, per_thread=10.0)
    yield chosen, synth
    chosen.close()


def test_each_scheduler_streams_its_jobs_to_one_final_message(
    scheduler: tuple[Scheduler, Synthesizer],
) -> None:
    sched, synth = scheduler
    texts = {"a": TEXT, "b": "Reply STOP to stop."}
    for uid, text in texts.items():
        sched.add(job(uid, text))
    assert sched.in_hand() == 2
    assert sched.current_load(3).qsize == 5  # requests waiting for a voice count as the worker's
    assert sched.threads >= 1
    out = Outbox()
    sched.start(out)
    turn(sched, out, lambda: all(out.ended(uid) for uid in texts))
    assert sched.in_hand() == 0 and sched.current_load(0).qsize == 0
    params = SynthesisParams(noise_scale=0.0, noise_w=0.0)
    for uid, text in texts.items():
        *chunks, final = out.of(uid)
        assert isinstance(final, StreamDone)
        assert chunks and all(isinstance(m, AudioChunkMsg) for m in chunks)
        pcm = b"".join(m.pcm for m in chunks if isinstance(m, AudioChunkMsg))
        got = np.frombuffer(pcm, dtype="<i2").astype(np.int32)
        whole = synth.synthesize(text, params).astype(np.int32)
        assert len(got) == len(whole) == final.audio_samples
        assert np.max(np.abs(got - whole)) <= 33  # windows match one-shot to float rounding


def test_each_scheduler_answers_a_cancel_with_one_final_message(
    scheduler: tuple[Scheduler, Synthesizer],
) -> None:
    sched, _ = scheduler
    assert sched.cancel("nobody") is None
    sched.add(job("early"))
    assert sched.cancel("early") == StreamDone("early", 0, 0.0)  # nothing computed yet
    assert sched.in_hand() == 0
    out = Outbox()
    sched.start(out)
    sched.add(job("late", TEXT + " " + TEXT))
    turn(sched, out, lambda: any(isinstance(m, AudioChunkMsg) for m in out.of("late")))
    done = sched.cancel("late")  # mid-stream
    if done is not None:  # else a thread inside its step sends it
        out(done)
    turn(sched, out, lambda: out.ended("late") and sched.in_hand() == 0)
    msgs = out.of("late")
    finals = [m for m in msgs if isinstance(m, StreamDone | StreamError)]
    assert finals == [msgs[-1]] and isinstance(msgs[-1], StreamDone)
    assert not out.of("early")
