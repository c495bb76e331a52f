"""Time to first audio over Wyoming against HTTP ``/synthesize``, same text, side by side.

One ``ttsvc serve --wyoming-port`` on loopback; rounds alternate between the protocols so both
see the same machine load. Each round measures, on a connection already open:

* ``http``: ``POST /synthesize`` (``format: pcm``, streamed) → the first body byte;
* ``wyoming``: ``synthesize`` (the whole text) → the first ``audio-chunk`` event;
* ``wyoming-stream``: Home Assistant's text stream, the text sent in small pieces: the piece that
  completes the first sentence (text after its end included) → the first ``audio-chunk``;
* ``wyoming-all-audio``: ``synthesize`` → ``audio-stop``, the time a server that sends audio
  only once a sentence is whole would make the client wait at best.

Usage: ``python benchmarks/wyoming_bench.py [--rounds N] [--workers N] [--engines-dir DIR]
[--json PATH]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
from wyoming.client import AsyncTcpClient
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop

from bench_common import DEFAULT_ENGINES, SERVER_LOG_DIR, Server, free_port, pct, write_atomic

TEXT = "The kitchen light is off. The bedroom lights are on now. Anything else?"
PIECE = 6
"""Characters per text piece of the streamed variant (a few LLM tokens)."""


async def first_audio(tcp: AsyncTcpClient) -> float:
    """Read events until the first audio-chunk; returns when it arrived."""
    while (event := await tcp.read_event()) is not None:
        if event.type == "audio-chunk":
            return time.perf_counter()
        if event.type == "error":
            raise RuntimeError(f"wyoming error: {event.data}")
    raise RuntimeError("wyoming connection closed before any audio")


async def drain(tcp: AsyncTcpClient, until: str) -> None:
    while (event := await tcp.read_event()) is not None and event.type != until:
        pass


async def http_ttfa(client: httpx.AsyncClient, text: str) -> float:
    started = time.perf_counter()
    async with client.stream("POST", "/synthesize",
                             json={"text": text, "format": "pcm"}) as response:  # fmt: skip
        response.raise_for_status()
        first = None
        async for chunk in response.aiter_raw():
            if chunk and first is None:
                first = time.perf_counter()
    assert first is not None
    return first - started


async def wyoming_ttfa(port: int, text: str) -> tuple[float, float]:
    """Time to the first audio and to the last (``audio-stop``: what a server that sends a
    sentence once it is whole would make a client wait for, at this server's speed)."""
    async with AsyncTcpClient("127.0.0.1", port, read_timeout=60) as tcp:
        started = time.perf_counter()
        await tcp.write_event(Synthesize(text=text).event())
        first = await first_audio(tcp)
        await drain(tcp, "audio-stop")
    return first - started, time.perf_counter() - started


async def wyoming_stream_ttfa(port: int, text: str) -> float:
    pieces = [text[i : i + PIECE] for i in range(0, len(text), PIECE)]
    # the first sentence is complete once a visible character after it is sent (or at the stop)
    end = text.index(". ") + 3 if ". " in text else len(text) + 1
    async with AsyncTcpClient("127.0.0.1", port, read_timeout=60) as tcp:
        await tcp.write_event(SynthesizeStart().event())
        sent, complete_at, first = 0, 0.0, None
        reader = asyncio.ensure_future(first_audio(tcp))
        for piece in pieces:
            await tcp.write_event(SynthesizeChunk(text=piece).event())
            sent += len(piece)
            if first is None and sent >= end:
                complete_at = time.perf_counter()
                first = await reader  # the rest of the text waits: a slow LLM, at worst
        await tcp.write_event(SynthesizeStop().event())
        if first is None:
            complete_at = time.perf_counter()
            first = await reader
        await drain(tcp, "synthesize-stopped")
    return first - complete_at


def summary(values: list[float]) -> dict[str, float | None]:
    ms = [1000 * v for v in values]
    return {"n": len(ms), "median_ms": statistics.median(ms), "p90_ms": pct(ms, 90),
            "min_ms": min(ms)}  # fmt: skip


async def measure(server: Server, wyoming_port: int, rounds: int,
                  text: str) -> dict[str, list[float]]:  # fmt: skip
    found: dict[str, list[float]] = {"http": [], "wyoming": [], "wyoming-stream": [],
                                     "wyoming-all-audio": []}  # fmt: skip
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60, trust_env=False) as c:
        for _ in range(3):  # warm-up: connections, the worker's first streams
            await http_ttfa(c, text)
            await wyoming_ttfa(wyoming_port, text)
        for _ in range(rounds):
            found["http"].append(await http_ttfa(c, text))
            first, last = await wyoming_ttfa(wyoming_port, text)
            found["wyoming"].append(first)
            found["wyoming-all-audio"].append(last)
            found["wyoming-stream"].append(await wyoming_stream_ttfa(wyoming_port, text))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--engines-dir", type=Path, default=DEFAULT_ENGINES)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--text", default=TEXT, help="what to say (default: a short reply)")
    args = parser.parse_args()
    wyoming_port = free_port()
    flags = ["--wyoming-port", str(wyoming_port), "--metrics-port", "0"]
    server = Server(args.engines_dir, args.workers, SERVER_LOG_DIR / "wyoming_bench.log",
                    extra_args=flags)  # fmt: skip
    try:
        server.wait_ready(lambda c: c.get("/health").status_code == 200, timeout_s=600,
                          poll_timeout_s=1, interval_s=0.2)  # fmt: skip
        found = asyncio.run(measure(server, wyoming_port, args.rounds, args.text))
    finally:
        server.stop()
    report = {name: summary(values) for name, values in found.items()}
    text = args.text
    print(f"text: {text!r} ({len(text)} chars), {args.rounds} rounds, workers {args.workers}")
    for name, row in report.items():
        print(f"  {name:17} TTFA median {row['median_ms']:6.1f} ms  p90 {row['p90_ms']:6.1f} ms  "
              f"min {row['min_ms']:6.1f} ms")  # fmt: skip
    if args.json is not None:
        write_atomic(args.json, json.dumps({"text": text, "rounds": args.rounds, **report},
                                           indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
