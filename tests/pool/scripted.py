"""A real worker pool whose worker handles have no process behind them: a test speaks for the
worker by handing the pool its messages (a worker that misses deadlines or answers a swap on cue
cannot be spawned), on a real balancer and metrics registry."""

from __future__ import annotations

import asyncio
import multiprocessing as mp

from ttsvc.balancer import BalancerSettings, HeatScoreBalancer
from ttsvc.observability.metrics import ServiceMetrics
from ttsvc.pool.handle import WorkerHandle, WorkerSpec
from ttsvc.pool.supervisor import WorkerPool
from ttsvc.protocol import EngineSpec
from ttsvc.windows import WindowSchedule

LABEL = "1"


class Pool:
    """A pool whose worker handles have no process running behind them: the test speaks for
    the worker by handing the pool its messages."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        engine = EngineSpec(LABEL, "voice", 1, "", {}, (), "{}", "")
        spec = WorkerSpec(engine, threads=1, schedule=WindowSchedule(), max_sentence_chars=200)
        self.metrics = ServiceMetrics()
        self.balancer = HeatScoreBalancer(BalancerSettings(), self.loop.time)
        self.pool = WorkerPool(spec, 1, self.balancer, self.loop, self.metrics)
        self.pool.stop_respawning()  # an exit must not spawn a real worker

    def handle(self, wid: int) -> WorkerHandle:
        """A new worker process's handle, as a spawn would register it."""
        parent, child = mp.Pipe()
        child.close()
        process = mp.get_context("spawn").Process(target=print)  # never started
        handle = WorkerHandle(wid, process, parent)
        self.pool._adopt(handle)
        return handle

    def value(self, name: str, worker: int | None = None) -> float | None:
        labels = None if worker is None else {"worker": str(worker)}
        return self.metrics.registry.get_sample_value(name, labels)

    def close(self) -> None:
        for handle in self.pool.workers.values():
            handle.conn.close()
        self.loop.close()


def sent(handle: WorkerHandle) -> list[object]:
    """What the pool queued for a worker so far (no sender thread runs in these tests)."""
    found = []
    while not handle.outbox.empty():
        found.append(handle.outbox.get())
    return found
