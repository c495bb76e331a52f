"""What the worker loop asks of a scheduler, whichever one serves.

Why: a worker runs one of three schedulers (the single-loop ``StreamScheduler``, the GPU
``BatchStreamScheduler``, the threaded ``DeadlineScheduler``), and they differ in who runs their
steps (the loop's own thread, or compute threads of their own), in what their heartbeats can
report (only the deadline scheduler measures capacity and admits by it) and in what lock guards
their streams. Said once behind this interface, those differences stay inside each scheduler and
the loop (``worker.process``) reads the same whichever one it drives, without asking which.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from ttsvc.protocol import StreamDone, SynthesisJob
from ttsvc.synthesis import Synthesizer
from ttsvc.worker.streams import Send


@dataclass(frozen=True)
class Load:
    """A scheduler's figures for one heartbeat, read at one instant (as ``Heartbeat``'s)."""

    qsize: int
    """Streams here, running or waiting, and requests waiting for their voice to load."""
    capacity: float = 0.0
    demand: float = 0.0
    waiting: int = 0
    misses: int = 0
    late_s: float = 0.0


class Scheduler(Protocol):
    """A worker's streams and the compute that advances them, as the worker loop drives them:
    ``start`` once, ``pump`` on every turn of the loop (without waiting on the pipe while
    ``wants_turn``), ``close`` when the loop ends."""

    @property
    def threads(self) -> int:
        """Compute threads the scheduler runs streams on (``WorkerReady`` reports them)."""
        ...

    def add(self, job: SynthesisJob, synth: Synthesizer | None = None,
            voices: Mapping[str, Synthesizer] | None = None) -> None:  # fmt: skip
        """Take a new stream on ``synth`` (its voice's engines; default: the last ``use``d),
        with the other ``voices`` its script's runs are said in."""
        ...

    def cancel(self, uid: str) -> StreamDone | None:
        """Drop a stream: its final message to send, or None when unknown or when the scheduler
        sends it itself."""
        ...

    def use(self, synth: Synthesizer) -> None:
        """Start new streams on ``synth`` by default from now on; running ones keep theirs."""
        ...

    def in_hand(self) -> int:
        """Streams here, running or waiting: the worker is busy while there are any."""
        ...

    def current_load(self, elsewhere: int) -> Load:
        """The heartbeat's figures, counting ``elsewhere`` requests that wait outside the
        scheduler (for their voice to load)."""
        ...

    def stalled_for(self) -> float:
        """How long the oldest step still running on a thread of the scheduler's own has run
        (0 when none): the worker stops its heartbeats past ``HANG_S``."""
        ...

    def start(self, send: Send) -> None:
        """Begin computing: what the streams produce goes to ``send``."""
        ...

    def wants_turn(self) -> bool:
        """Whether ``pump`` has a step to run now: the loop must not then wait on its pipe."""
        ...

    def pump(self, send: Send) -> None:
        """Run what the loop's own thread owes the streams now (nothing, for a threaded one)."""
        ...

    def close(self) -> None:
        """Stop computing; threads stop after their current step."""
        ...
