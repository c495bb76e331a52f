"""One HTTP synthesis request as a client that plays the audio in real time would see it.

Why this exists: the comparison benchmark drives three different servers (ttsvc, Piper's HTTP
server, a load-per-request baseline) and the other HTTP benchmarks drive ttsvc in several
modes; they must time first audio and count underruns in exactly the same way, or their
figures stop being comparable. ``playback`` is pure arithmetic that ``tests/benchmarks`` checks
on synthetic timings; ``one_request`` is the thin network part around it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

WAV_HEADER_BYTES = 44
"""Every server measured here answers a WAV with a 44-byte header first; audio is what follows."""


@dataclass(frozen=True)
class Playback:
    """What a client that plays audio in real time from its first byte would have heard."""

    underruns: int
    """Reads that arrived after all audio before them had finished playing."""
    stall_s: float
    """Silence the player waited through, summed over the underruns."""
    cushion_s: float | None = None
    """The least audio the player still had queued when a later read arrived (negative: it had
    run dry that long); None for a stream of one read. A stall is rare and counted whole, so two
    variants that stall 1 % and 2 % look alike over 300 streams; the low percentiles of this
    margin move with every stream and show which one runs closer to a stall."""


def playback(reads: Sequence[tuple[float, float]]) -> Playback:
    """Underruns of a real-time player fed ``reads``: (arrival time s, audio seconds) in order.

    Playback starts when the first audio arrives. A later read that arrives after the audio
    received before it would have finished playing is an underrun: the player stalls until that
    read arrives and resumes from it, so one late read counts once (not once for each read after
    it). Reads with no audio (zero seconds) change nothing.
    """
    underruns = 0
    stall = 0.0
    cushion: float | None = None
    play_end: float | None = None
    for arrival, seconds in reads:
        if seconds <= 0:
            continue
        if play_end is None:
            play_end = arrival + seconds
            continue
        left = play_end - arrival
        cushion = left if cushion is None else min(cushion, left)
        if left < 0:
            underruns += 1
            stall += arrival - play_end
            play_end = arrival + seconds
        else:
            play_end += seconds
    return Playback(underruns, stall, cushion)


@dataclass
class Record:
    """One request as a client saw it. Times are milliseconds from its own send."""

    system: str
    concurrency: int
    """Closed-loop clients of its level; 0 in open-loop runs."""
    index: int
    text_index: int
    text_chars: int
    start_s: float = 0.0
    """Send time, seconds from the start of the level (to see ramp-up and drift)."""
    status: int | None = None
    error: str | None = None
    ttfa_ms: float | None = None
    latency_ms: float | None = None
    audio_s: float = 0.0
    sample_rate: int | None = None
    reads: int = 0
    underruns: int = 0
    stall_ms: float = 0.0
    cushion_ms: float | None = None
    """``Playback.cushion_s`` in milliseconds."""
    retry_after_s: float | None = None
    """A refusal's ``Retry-After`` in seconds (None: no refusal, or none given)."""

    @property
    def ok(self) -> bool:
        """Completed with audio and no error."""
        return self.error is None


@dataclass
class Stream:
    """The audio of one streamed WAV answer as it arrived (see ``read_wav``)."""

    ttfa_ms: float | None = None
    """First audio byte after the WAV header, ms from the send; None where none came."""
    audio_bytes: int = 0
    """PCM16 bytes after the header."""
    rate: int = 0
    """Sample rate from the header (0 where the header never completed)."""
    reads: list[tuple[float, float]] = field(default_factory=list)
    """(arrival ``perf_counter`` s, audio seconds) of every read that carried audio."""


async def read_wav(resp: httpx.Response, sent: float) -> Stream:
    """Read a streamed WAV answer to its end, timing each read against ``sent``.

    TTFA ends at the first audio byte after the 44-byte WAV header: a header alone is not audio.
    Bytes are read with ``aiter_raw`` so nothing is buffered or decoded between socket and clock.
    The sample rate comes from the WAV header itself, so servers that send no rate header (Piper)
    are read the same way.
    """
    out = Stream()
    header = b""
    async for raw in resp.aiter_raw():
        now = time.perf_counter()
        audio = raw
        if len(header) < WAV_HEADER_BYTES:
            take = WAV_HEADER_BYTES - len(header)
            header += raw[:take]
            audio = raw[take:]
            if len(header) == WAV_HEADER_BYTES:
                out.rate = int.from_bytes(header[24:28], "little")
        if not audio or not out.rate:
            continue
        if out.audio_bytes == 0:
            out.ttfa_ms = (now - sent) * 1000.0
        out.audio_bytes += len(audio)
        out.reads.append((now, len(audio) / 2 / out.rate))
    return out


async def one_request(
    client: httpx.AsyncClient, url: str, payload: dict[str, Any], rec: Record
) -> None:
    """Send one synthesis request, read the WAV to its end (``read_wav``), and fill in ``rec``
    with what a real-time player would have heard (``playback``)."""
    sent = time.perf_counter()
    try:
        async with client.stream("POST", url, json=payload) as resp:
            rec.status = resp.status_code
            if resp.status_code != 200:
                await resp.aread()
                rec.error = f"http_{resp.status_code}"
                wait = resp.headers.get("retry-after", "")
                rec.retry_after_s = float(wait) if wait.isdigit() else None
                rec.latency_ms = (time.perf_counter() - sent) * 1000.0
                return
            got = await read_wav(resp, sent)
            rate = got.rate
            rec.ttfa_ms = got.ttfa_ms
            rec.latency_ms = (time.perf_counter() - sent) * 1000.0
            rec.sample_rate = rate or None
            rec.reads = len(got.reads)
            rec.audio_s = got.audio_bytes / 2 / rate if rate else 0.0
            heard = playback(got.reads)
            rec.underruns = heard.underruns
            rec.stall_ms = heard.stall_s * 1000.0
            rec.cushion_ms = None if heard.cushion_s is None else heard.cushion_s * 1000.0
            if got.audio_bytes == 0:
                rec.error = "no_audio"
    except httpx.HTTPError as exc:
        rec.error = type(exc).__name__
        rec.latency_ms = (time.perf_counter() - sent) * 1000.0


def playback_end_s(rec: Record) -> float:
    """Seconds from a request's send until a real-time player finishes its audio: first audio,
    plus every stall, plus the audio's own length (0 for a failed request)."""
    if rec.ttfa_ms is None:
        return 0.0
    return (rec.ttfa_ms + rec.stall_ms) / 1000.0 + rec.audio_s
