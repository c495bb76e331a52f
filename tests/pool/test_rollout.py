"""Engine rollouts over the pool's workers, driven by scripted worker answers."""

from __future__ import annotations

import asyncio

from tests.pool.scripted import LABEL, Pool, sent
from ttsvc.protocol import EngineSpec, EnginesSwapped, SwapEngines, WorkerReady


def test_a_worker_ready_while_a_voice_is_staged_learns_it_too(pool: Pool) -> None:
    """A new voice is staged on the one worker READY then; a worker that says READY during the
    canary started without it and must be told once the candidate passed, or it would answer
    unknown_voice for a voice GET /voices lists as served."""
    first, second = pool.handle(0), pool.handle(1)
    pool.pool._on_message(first, WorkerReady(0, "voice", LABEL, 22050, voices=("voice",)))
    engine = EngineSpec("1", "other", 1, "", {}, (), "{}", "")

    async def scenario() -> EnginesSwapped:
        rollout = asyncio.ensure_future(pool.pool.rollout(engine, timeout=5))
        await asyncio.sleep(0)  # the staging request goes out to worker 0
        (staging,) = sent(first)
        assert isinstance(staging, SwapEngines) and staging.load
        # worker 1 comes up during the canary, spawned before the voice passed
        pool.pool._on_message(second, WorkerReady(1, "voice", LABEL, 22050, voices=("voice",)))
        assert sent(second) == []
        pool.pool._on_message(first, EnginesSwapped(0, "1", True, "", staging.seq))
        for _ in range(3):
            await asyncio.sleep(0)
        (told,) = sent(second)
        assert isinstance(told, SwapEngines) and told.spec == engine and not told.load
        pool.pool._on_message(second, EnginesSwapped(1, "1", True, "", told.seq))
        return await rollout

    reply = pool.loop.run_until_complete(scenario())
    assert reply.ok
    assert pool.pool.spec.voices["other"] == engine
    assert second.specs["other"] == "1"
