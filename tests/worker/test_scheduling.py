"""The worker's one scheduler driven as the worker loop drives it (add, start, cancel, load,
close), on the CPU's engines and on engines that batch: each streams its jobs to one final
message and answers a cancel, whether a step serves one stream or several."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from tests.worker.fakes import fake_gpu_batch_engines
from ttsvc.backends.base import EngineSet
from ttsvc.protocol import AudioChunkMsg, FromWorker, StreamDone, StreamError, SynthesisJob
from ttsvc.synthesis import SynthesisParams, Synthesizer
from ttsvc.worker.batching import batch_limit
from ttsvc.worker.deadline import DeadlineScheduler

TEXT = "Your order has shipped. It will arrive on Thursday between nine and noon."
WAIT_S = 120.0
"""Longest a test waits for its streams (a busy two-core machine)."""


def job(uid: str, text: str = TEXT) -> SynthesisJob:
    return SynthesisJob(uid, text, 1.0, 0.0, 0.0, 0.2)


class Outbox:
    """The pipe to the gateway: what every thread sent, in order; a test waits on it."""

    def __init__(self) -> None:
        self.sent: list[FromWorker] = []
        self._changed = threading.Condition()

    def __call__(self, msg: FromWorker) -> None:
        with self._changed:
            self.sent.append(msg)
            self._changed.notify_all()

    def of(self, uid: str) -> list[FromWorker]:
        with self._changed:
            return [m for m in self.sent if getattr(m, "uid", None) == uid]

    def ended(self, uid: str) -> bool:
        return any(isinstance(m, StreamDone | StreamError) for m in self.of(uid))

    def wait(self, until: Callable[[], bool]) -> None:
        """Until ``until`` holds, woken by every message sent (``until`` reads ``of``, which
        takes the same lock: a condition's lock is re-entrant here)."""
        with self._changed:
            assert self._changed.wait_for(until, timeout=WAIT_S), "the streams never ended"


@pytest.fixture(scope="module")
def calibrated(engine_set: EngineSet) -> Synthesizer:
    """A synthesizer that knows its costs, as a worker's does (the deadline policy needs them)."""
    synth = Synthesizer(engine_set)
    synth.calibrate()
    return synth


@pytest.fixture(params=["cpu", "batching"])
def scheduler(request: pytest.FixtureRequest) -> Iterator[tuple[DeadlineScheduler, Synthesizer]]:
    """The scheduler as a worker builds it, on the CPU's engines and on engines that batch, and
    the synthesizer whose audio its streams carry."""
    if request.param == "cpu":
        synth: Synthesizer = request.getfixturevalue("calibrated")
        serving = synth
    else:
        synth = request.getfixturevalue("context_synth")  # context engines: what GPU plans are
        serving = Synthesizer(fake_gpu_batch_engines(synth.engines, 4, []))
    chosen = DeadlineScheduler(serving, threads=2, per_thread=10.0,
                               max_batch=batch_limit(serving.engines))  # fmt: skip
    yield chosen, synth
    chosen.close()


def test_each_scheduler_streams_its_jobs_to_one_final_message(
    scheduler: tuple[DeadlineScheduler, Synthesizer],
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
    out.wait(lambda: all(out.ended(uid) for uid in texts))
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
    scheduler: tuple[DeadlineScheduler, Synthesizer],
) -> None:
    sched, _ = scheduler
    assert sched.cancel("nobody") is None
    sched.add(job("early"))
    assert sched.cancel("early") == StreamDone("early", 0, 0.0)  # nothing computed yet
    assert sched.in_hand() == 0
    out = Outbox()
    sched.start(out)
    sched.add(job("late", TEXT + " " + TEXT))
    out.wait(lambda: any(isinstance(m, AudioChunkMsg) for m in out.of("late")))
    done = sched.cancel("late")  # mid-stream
    if done is not None:  # else a thread inside its step sends it
        out(done)
    out.wait(lambda: out.ended("late"))
    assert sched.in_hand() == 0
    msgs = out.of("late")
    finals = [m for m in msgs if isinstance(m, StreamDone | StreamError)]
    assert finals == [msgs[-1]] and isinstance(msgs[-1], StreamDone)
    assert not out.of("early")
