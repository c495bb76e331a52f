"""How a worker computes and what it starts with, as the gateway and the pool name it.

Its own module so that the gateway and the pool, which only pass these on to the worker
processes they spawn, import no part of the worker stack (ONNX Runtime, the synthesizer, the
scheduler): those load in the worker processes alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ttsvc.protocol import EngineSpec
from ttsvc.windows import WindowSchedule


@dataclass(frozen=True)
class ComputePlan:
    """How a worker computes: its compute threads, admission limit and step floor."""

    threads: int = 1
    """Compute threads over the process's one deadline queue."""
    load_limit: float = 0.75
    """Share of the measured real-time capacity admitted streams may demand."""
    step_floor_s: float = 0.05
    """The shortest bound the scheduler puts on a step."""
    whole_sentences: bool = True
    """Run sentences whole on the plain graphs where their listeners can wait
    (``DeadlinePolicy.whole``)."""


@dataclass(frozen=True)
class WorkerConfig:
    """Everything one worker process starts with, in one value: the pool builds it at each
    spawn from its current spec (the last good engines), and the process reads it once.

    Frozen: a spawned process gets a copy, so nothing the gateway changes later (a rollout
    retargets the pool's spec) can reach a running worker except by message."""

    engine: EngineSpec
    """The voice loaded at start; its canary also measures the process's capacity."""
    threads: int
    """ONNX Runtime intra-op threads per engine run."""
    schedule: WindowSchedule
    max_sentence_chars: int
    plan: ComputePlan = ComputePlan()
    log_level: str = "info"
    log_format: str = "auto"
    voices: Mapping[str, EngineSpec] = field(default_factory=dict)
    """The other voices served, loaded when a request first needs one."""
    voice_budget: int = 0
    """Engine bytes the worker may hold at once (0: no limit)."""
    memory_bytes: int = 0
    """The process's cap on its own memory (0: none; ``worker.limits``)."""
