"""Engine rollouts: a voice's new engine set staged on one worker, then switched on the rest.

The pool's half that speaks to workers about engines, not streams: the swap requests in flight
(one per worker, each answered or failed once) and the order of a rollout. It shares the pool's
worker handles and spec, and is told of answers and exits by the pool's message handler.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from ttsvc.observability.logs import get_logger
from ttsvc.pool.handle import WorkerHandle, WorkerSpec
from ttsvc.protocol import EngineSpec, EnginesSwapped, SwapEngines

log = get_logger("pool")


class Rollouts:
    """Stages and switches engine sets over the pool's workers, one rollout at a time."""

    def __init__(self, workers: dict[int, WorkerHandle], spec: WorkerSpec,
                 loop: asyncio.AbstractEventLoop) -> None:  # fmt: skip
        """``workers`` and ``spec`` are the pool's own (a rollout updates the spec's engines:
        workers spawned later start on the candidate)."""
        self.workers = workers
        self.spec = spec
        self.loop = loop
        self._pending: dict[int, tuple[int, asyncio.Future[EnginesSwapped]]] = {}
        self._seq = 0
        self._lock = asyncio.Lock()
        """One rollout at a time: a worker answers one swap at a time, and voices' swappers
        may find candidates at once."""

    def next_seq(self) -> int:
        """A new swap request's number: a worker's answer names the request it answers."""
        self._seq += 1
        return self._seq

    def waiting_on(self, wid: int) -> bool:
        """Whether a swap request to worker ``wid`` is still unanswered."""
        pending = self._pending.get(wid)
        return pending is not None and not pending[1].done()

    def answered(self, wid: int, reply: EnginesSwapped) -> None:
        """A worker's answer (or, ``worker`` -1, its exit): resolves the request waiting on it; a
        late answer to an older request is ignored."""
        pending = self._pending.get(wid)
        if pending is None or pending[1].done():
            return
        if reply.worker == -1 or pending[0] == reply.seq:
            pending[1].set_result(reply)

    async def run(self, engine: EngineSpec, timeout: float) -> EnginesSwapped:
        """Switch READY workers to ``engine`` (``WorkerPool.rollout`` says how)."""
        async with self._lock:
            return await self._rollout(engine, timeout)

    async def _rollout(self, engine: EngineSpec, timeout: float) -> EnginesSwapped:
        ready = [w for w in sorted(self.workers) if self.workers[w].ready is not None]
        if not ready:
            return EnginesSwapped(-1, engine.label, False, "no ready worker to stage the candidate")
        ready.sort(key=lambda w: engine.voice not in self.workers[w].voices)  # stable: by id
        first = await self._swap_one(ready[0], engine, timeout)
        if not first.ok:
            return first
        if engine.voice == self.spec.engine.voice:
            self.spec.engine = engine
        self.spec.voices[engine.voice] = engine
        # every worker READY now, not only those ready before the canary: one that said READY
        # while it ran started without the candidate (later ones start with it)
        others = [w for w in sorted(self.workers)
                  if w != ready[0] and self.workers[w].ready is not None]  # fmt: skip
        replies = await asyncio.gather(*(self._swap_one(w, engine, timeout, load=False)
                                         for w in others))  # fmt: skip
        for wid, reply in zip(others, replies, strict=True):
            if not reply.ok and wid in self.workers:
                log.warning("worker_swap_failed", worker=wid, reason=reply.reason)
                self.workers[wid].kill()  # respawns onto the verified candidate
        return first

    async def _swap_one(
        self, wid: int, engine: EngineSpec, timeout: float, load: bool = True
    ) -> EnginesSwapped:
        """Ask one worker to load ``engine`` and switch (``load=False``: only if it holds the
        voice, else to remember the spec); its answer, or a failure."""
        handle = self.workers.get(wid)
        if handle is None or handle.ready is None:
            return EnginesSwapped(-1, engine.label, False, "worker not ready")
        seq = self.next_seq()
        future: asyncio.Future[EnginesSwapped] = self.loop.create_future()
        self._pending[wid] = (seq, future)
        handle.send(SwapEngines(engine, seq, load))
        try:
            reply = await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            # it may still switch later: replace it, so it respawns on the last good engines
            handle.kill()
            reply = EnginesSwapped(-1, engine.label, False, f"no answer in {timeout:g} s")
        finally:
            self._pending.pop(wid, None)
        if reply.ok:
            handle.specs[engine.voice] = engine.label
        if reply.ok and handle.ready is not None and engine.voice == handle.ready.voice:
            handle.ready = replace(handle.ready, engine_version=engine.label)
            log.info("worker_swapped", worker=wid, engine_version=engine.label)
        return reply

