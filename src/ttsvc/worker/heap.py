"""The worker's C heap: memory freed by a released engine set or a long stream goes back to the OS.

Why: with glibc's defaults a worker's RSS ratchets up and never comes down. Every engine set
loads hundreds of megabytes of weights, arena chunks and parse buffers through ``malloc``; once
glibc has freed one large mapped block it raises its mmap threshold to that block's size, so the
next engine set's weights land in the heap arenas instead, where freeing them leaves holes glibc
keeps. A worker then grew by about one engine set per hot swap, and long texts left it higher,
until a container's memory limit killed it. Two calls fix it at the allocator:

- ``mallopt(M_MMAP_THRESHOLD)`` pins the threshold at glibc's own default (which also turns its
  dynamic raising off), so every large block keeps its own mapping and is unmapped when freed;
- ``malloc_trim(0)`` hands the free pages inside the arenas (small blocks: graph parsing, Python
  objects) back; the worker calls it when idle, so the few milliseconds never delay a window.

The inference runtime's own arena (ONNX Runtime's, shared by a worker's sessions) keeps every
region it ever grew to, the peak of an old and a new engine set running side by side during a swap
included. Once the worker has been idle for ``SHRINK_IDLE_S`` it has the arena hand its free
regions back too, once per idle spell. Not at every trim: a shrunk arena faults its pages in again
on the next request's first window, which a worker busy with back-to-back requests should not
pay; a pause of seconds is where memory can be given back for free (the alternatives measured
are in ``docs/decisions.md``).

``settled`` says the worker has given back all its last work freed: a worker's resting size (what
a memory limit or a memory test should read) is its RSS then, not at the end of a response.

The two calls are glibc's; elsewhere (musl, macOS) they are absent and only the arena shrinks.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import time
from collections.abc import Callable

M_MMAP_THRESHOLD = -3
"""``mallopt`` parameter number (glibc ``malloc.h``)."""
MMAP_THRESHOLD_BYTES = 128 * 1024
"""glibc's default threshold: smaller blocks come from the arenas, larger ones are mapped."""
TRIM_INTERVAL_S = 1.0
"""At most one trim per this many seconds: a worker that goes idle between short requests many
times a second would otherwise give pages back only to fault them in again."""
SHRINK_IDLE_S = 2.0
"""Idle this long after its last work, a worker also shrinks the runtime's arena: longer than the
gap between a client's back-to-back requests, shorter than a pause in a conversation."""


def _glibc() -> ctypes.CDLL | None:
    """The process's C library if it is glibc (has ``malloc_trim``), else None."""
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    if not hasattr(libc, "malloc_trim") or not hasattr(libc, "mallopt"):
        return None
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    libc.malloc_trim.restype = ctypes.c_int
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    return libc


class Heap:
    """Allocator settings and idle-time trims for one worker process (its compute thread)."""

    def __init__(
        self,
        trim_interval_s: float = TRIM_INTERVAL_S,
        shrink_arena: Callable[[], object] | None = None,
        shrink_idle_s: float = SHRINK_IDLE_S,
    ) -> None:
        """``shrink_arena``: the inference runtime's call that returns its arena's free regions,
        made once the worker has been idle for ``shrink_idle_s``."""
        self._libc = _glibc()
        self._interval = trim_interval_s
        self._shrink_arena = shrink_arena
        self._shrink_idle = shrink_idle_s
        self._last_trim = float("-inf")
        self._last_freed = float("-inf")
        self._dirty = False
        self._grown = False
        self.trims = 0
        self.shrinks = 0

    @property
    def available(self) -> bool:
        """Whether this process's C library is glibc, which the calls need."""
        return self._libc is not None

    def pin_mmap_threshold(self) -> bool:
        """Keep large blocks in their own mappings for the life of the process; call before the
        engines load. False where glibc is not there to ask."""
        if self._libc is None:
            return False
        return bool(self._libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))

    def freed(self) -> None:
        """Memory may have been freed (a stream ran or ended, engines were replaced); call on
        every step of work, so the idle time counts from the last."""
        self._dirty = True
        self._grown = self._shrink_arena is not None
        self._last_freed = time.monotonic()

    @property
    def settled(self) -> bool:
        """Whether everything the last work freed has been given back (trimmed, and the arena
        shrunk): the process is at its resting size."""
        return not self._dirty and not self._grown

    def trim_if_due(self) -> bool:
        """Trim if something was freed since the last trim and the interval has passed; once
        idle for the shrink delay, shrink the runtime's arena first. Call only while no stream
        is waiting. True when it trimmed."""
        now = time.monotonic()
        shrink = self._grown and now - self._last_freed >= self._shrink_idle
        if not shrink and (not self._dirty or now - self._last_trim < self._interval):
            return False
        if shrink and self._shrink_arena is not None:
            self._shrink_arena()
            self.shrinks += 1
            self._grown = False
        if self._libc is not None:
            self._libc.malloc_trim(0)
        self._last_trim = now
        self._dirty = False
        self.trims += 1
        return True
