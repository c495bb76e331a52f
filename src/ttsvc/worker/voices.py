"""The voices one worker process holds: loaded when a request needs one, evicted past a budget.

A service mounts many voices, but a worker that loaded every one would hold hundreds of
megabytes of weights most requests never touch. So a worker knows every voice's last good engine
spec (the gateway sends them) and loads a voice the first time a request asks for it (the
request waits for the load, tens of milliseconds); past the memory budget it lets go of the voice
used least recently. Streams keep the engines they started on, so evicting a voice never cuts a
stream: its memory is freed when its last stream ends.

Pure bookkeeping, no threads or IO: the worker's main loop owns it.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

from ttsvc.protocol import EngineSpec, SynthesisJob
from ttsvc.repository.manifest import Manifest

T = TypeVar("T")
"""What a held voice is: the worker's ``Synthesizer``; anything in the policy tests."""


def spec_bytes(spec: EngineSpec) -> int:
    """Bytes of an engine set's files, as its manifest lists them: the least a loaded set takes
    (ONNX Runtime's sessions take about twice that, with their arenas and packed weights)."""
    return sum(entry.size for entry in Manifest.model_validate_json(spec.manifest).files.values())


def resident_bytes() -> int:
    """This process's resident set size (Linux ``/proc/self/statm``; 0 where there is none)."""
    try:
        pages = Path("/proc/self/statm").read_text(encoding="ascii").split()[1]
        return int(pages) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def footprint(spec: EngineSpec, grown: int) -> float:
    """Resident bytes per byte of engine files, from the worker's first voice: ``grown`` is how
    much the process grew loading and warming it up. Measured once, at start: a later load
    mostly reuses memory the allocator kept from an evicted voice, so its own growth says
    little about what the voice holds. Never below 1 (a voice holds at least its weights)."""
    files = spec_bytes(spec)
    return max(1.0, grown / files) if files else 1.0


@dataclass
class VoiceSet(Generic[T]):
    """Known specs, held voices in least-recently-used order, and requests waiting for a load."""

    known: dict[str, EngineSpec]
    """Every voice the gateway serves, by name: the spec a load of it uses."""
    budget_bytes: int = 0
    """Most bytes the held voices may take (0: no limit), each counted by ``size``. The voice
    just loaded always stays, so a budget below one voice still serves, one at a time."""
    per_file_byte: float = 1.0
    """Resident bytes a held voice takes per byte of its engine files (``footprint``)."""
    held: OrderedDict[str, tuple[T, int]] = field(default_factory=OrderedDict)
    """Voice → (engines, bytes), least recently used first."""
    waiting: dict[str, list[SynthesisJob]] = field(default_factory=dict)
    """Voice being loaded → the requests that wait for it, in arrival order."""

    def size(self, spec: EngineSpec) -> int:
        """Bytes ``spec``'s voice counts against the budget once held."""
        return int(self.per_file_byte * spec_bytes(spec))

    def get(self, voice: str) -> T | None:
        """The held engines of ``voice`` (now the most recently used), or ``None``."""
        entry = self.held.get(voice)
        if entry is None:
            return None
        self.held.move_to_end(voice)
        return entry[0]

    def put(self, voice: str, engines: T, size: int) -> list[str]:
        """Hold ``engines`` as ``voice`` (replacing what it held) and let go of the least
        recently used others while the total is over the budget; returns those evicted."""
        self.held[voice] = (engines, size)
        self.held.move_to_end(voice)
        evicted: list[str] = []
        while self.budget_bytes and len(self.held) > 1 and self.used() > self.budget_bytes:
            oldest = next(iter(self.held))
            del self.held[oldest]
            evicted.append(oldest)
        return evicted

    def used(self) -> int:
        """Bytes the held voices take, as counted against the budget."""
        return sum(size for _, size in self.held.values())

    def wait(self, job: SynthesisJob, voice: str) -> bool:
        """Queue ``job`` until ``voice`` is loaded; True when it is the first to wait (the
        caller starts the load)."""
        jobs = self.waiting.setdefault(voice, [])
        jobs.append(job)
        return len(jobs) == 1

    def loaded(self, voice: str) -> list[SynthesisJob]:
        """The load of ``voice`` ended (held or failed): the requests that waited for it."""
        return self.waiting.pop(voice, [])

    def drop_waiting(self, uid: str) -> bool:
        """Forget a waiting request (its client left); whether it was waiting."""
        for voice, jobs in self.waiting.items():
            for job in jobs:
                if job.uid == uid:
                    jobs.remove(job)
                    if not jobs:  # no request needs the voice any more: do not load it
                        del self.waiting[voice]
                    return True
        return False

    def waiting_count(self) -> int:
        """Requests waiting for a voice to load."""
        return sum(len(jobs) for jobs in self.waiting.values())

    def names(self) -> tuple[str, ...]:
        """Voices held, least recently used first."""
        return tuple(self.held)

    def learn(self, specs: Mapping[str, EngineSpec]) -> None:
        """Remember newer specs (a held voice is swapped through its own staged load)."""
        self.known.update(specs)
