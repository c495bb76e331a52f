"""Frame windows of a streamed sentence: how many frames each engine run covers.

Its own module (no numpy, no engines) so that the settings, the gateway and the pool, which only
carry a schedule to the worker processes, import none of the synthesizer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass

DELIVERY_S = 0.03
"""A chunk must reach the player, not only leave the worker, by its deadline: the pipe, the
gateway's event loop and the socket take about this long on a loaded machine (the worker's
deadlines count it too, ``worker.deadline_policy``)."""

Budget = Callable[[], "float | None"]
"""Compute seconds the next window may take (None: no limit), asked as it is sized."""


@dataclass(frozen=True)
class WindowSchedule:
    """Frame window sizes: small first (time to first audio), then growing fast (throughput).

    Every window carries the vocoder's context of overlap on each side, so few large windows
    cost far less than many small ones (figures in ``docs/decisions.md``). What bounds growth is
    playback: a window must be computed before the audio already sent runs out, so when the
    synthesizer knows its cost per frame, each window is capped to a share of the audio sent
    before it.
    """

    first: int = 16
    """Frames in the first window of a sentence (one frame = hop samples, 11.6 ms at 22050 Hz):
    enough audio (186 ms) to cover a peer stream's sentence start on the same worker, which half
    of it did not (``docs/decisions.md``)."""
    growth: float = 8.0
    """Each window is up to this many times the previous one..."""
    max: int = 512
    """...and at most this many frames."""
    realtime_share: float = 0.5
    """A window may take at most this share of the audio already sent, less ``delivery_s``, to
    compute (the rest is headroom for other streams on the same worker)."""
    delivery_s: float = DELIVERY_S
    """Audio already sent that the next window's compute cannot use, because the chunk must
    also travel to the player by then. It matters only after a lone stream's 4-frame first
    chunk (46 ms of audio): counting all of it let the second window grow to 32 frames, ~23 ms
    of compute with its flow call, and 1-2 % of one client's streams ran dry there by 1-6 ms
    (``docs/decisions.md``); 16 ms of it leave 13 frames. After a 16-frame first chunk (186
    ms) it trims the second window below the growth's 128 frames only where a frame costs more
    than ~0.6 ms."""
    shared_min: int = 32
    """Frames a window keeps however small a ``budget`` asks for: below this the vocoder's
    context would cost more than the window's own frames."""
    alone_first: int = 4
    """Frames in the first window of a stream that starts while no other stream is on its
    worker (0: ``first`` always). With nothing else playing, nothing needs the longer first
    chunk to cover a peer's sentence start, and a smaller window starts audio sooner: on
    stateful engines a lone stream's first chunk took 7-8 ms less over HTTP (``docs/first-
    audio.md``). The next window follows at once on the same idle cores."""
    def __post_init__(self) -> None:
        if self.first < 1 or self.max < self.first or self.growth < 1.0 or self.alone_first < 0:
            raise ValueError(f"invalid window schedule {self}")
        if not 0.0 < self.realtime_share <= 1.0 or self.delivery_s < 0.0:
            raise ValueError(f"invalid window schedule {self}")

    def alone(self) -> WindowSchedule:
        """This schedule for a stream that starts with its worker to itself."""
        if not self.alone_first or self.alone_first >= self.first:
            return self
        return dataclasses.replace(self, first=self.alone_first)

    def windows(
        self,
        frames: int,
        *,
        frame_cost_s: float = 0.0,
        frame_s: float = 0.0,
        context: int = 0,
        budget: Budget | None = None,
        window_cost_s: float = 0.0,
    ) -> Iterator[tuple[int, int]]:
        """``[start, end)`` frame ranges covering ``frames`` frames, decided one at a time.

        ``frame_cost_s`` (compute seconds per frame, context included), ``frame_s`` (audio
        seconds per frame) and ``context`` (overlap frames per window) enable the playback cap;
        without them the sizes follow ``first``/``growth``/``max`` alone. ``budget``, asked
        just before each window after the first, caps that window's compute time (seconds, or
        None for no cap): a worker uses it so one stream's window cannot outlast the audio
        other streams still have buffered. ``window_cost_s`` is what one window's own engine run
        costs per frame, when the flow runs as a step of its own (else ``frame_cost_s``).

        Not scaled down for a busy worker: tried (windows sized by 1 / streams on the worker),
        it left underruns at concurrency 4 unchanged and, in overload, cut throughput from 20 to
        13 audio seconds per second, because small windows pay the overlap again and again.
        """
        start, size, limit = 0, self.first, float("inf")
        while start < frames:
            if start > 0 and budget is not None and frame_cost_s > 0:
                allowed = budget()  # asked now, as the window is about to be computed
                if allowed is not None:
                    cost = window_cost_s or frame_cost_s
                    fits = max(self.shared_min, int(allowed / cost) - context)
                    size, limit = min(size, fits), min(limit, fits)
            end = min(frames, start + size)
            size = min(self.max, max(size + 1, int(size * self.growth)))
            next_limit = float("inf")
            if frame_cost_s > 0:
                usable = end * frame_s - self.delivery_s
                next_limit = self.realtime_share * usable / frame_cost_s - context
                size = max(self.first, min(size, int(next_limit)))
            tail = frames - end
            if start > 0 and tail < size // 2 and frames - start <= limit:
                end = frames  # a short tail costs a window's context for little audio: merge it
            elif 0 < tail < max(2, self.first // 2):
                end = frames  # a sliver after this window (the cap kept it from merging above):
                # a few frames more cost less than a window of its own
            elif 0 < tail < self.first < end - start:
                # the budget keeps the tail out of this window: leave it a first window's
                # frames rather than a sliver that pays a whole window's context
                end = frames - self.first
            yield start, end
            start, limit = end, max(next_limit, self.first)
