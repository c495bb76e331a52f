"""How a worker computes, as the gateway and the pool name it.

Its own module so that the gateway and the pool, which only pass a plan on to the worker
processes they spawn, import no part of the worker stack (ONNX Runtime, the synthesizer, the
schedulers): those load in the worker processes alone.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ComputePlan:
    """How a worker computes: its scheduler, compute threads and admission limit."""

    threads: int = 1
    """Compute threads over the process's one deadline queue (``deadline`` scheduler)."""
    scheduler: str = "deadline"
    """``deadline`` (``worker.deadline``) or ``legacy`` (``worker.compute``: one thread)."""
    load_limit: float = 0.75
    """Share of the measured real-time capacity admitted streams may demand."""
    step_floor_s: float = 0.05
    """The shortest bound the deadline scheduler puts on a step."""
