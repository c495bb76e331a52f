"""Time to first audio for every API a voice agent can use, side by side on the same texts.

Why this exists: a voice agent (LiveKit, Pipecat, Home Assistant) can reach ttsvc over HTTP,
OpenAI's speech events, the incremental-text WebSocket or the Wyoming protocol; what it feels is
how soon the first sound comes after its text is out. Measuring every API in one run, on one
server, on the same texts in rotating order, is what makes their figures comparable: separate
runs see a different machine.

One ``ttsvc serve`` (default workers, ``--wyoming-port`` on a free port) on loopback. Each round
measures, for a short one-sentence reply and a three-sentence reply, in an order that rotates
from round to round so no API always goes first:

* ``http``: ``POST /synthesize`` (``pcm``, streamed) on a warm keep-alive connection, from the
  request to the first body byte;
* ``sse``: ``POST /v1/audio/speech`` with ``stream_format: "sse"`` (``pcm``), to the first
  ``speech.audio.delta``;
* ``ws flush``: a ``/synthesize/stream`` session gets the whole text in one ``append`` and a
  ``flush``, from the ``append`` to the first ``audio`` message;
* ``ws tokens``: the same session protocol, the text sent token by token (word by word): from the
  token that completes the first sentence (the one after its full stop; for a one-sentence text
  the closing ``flush``) to the first ``audio`` message;
* ``wyoming``: ``synthesize`` with the whole text, to the first ``audio-chunk``;
* ``wyoming stream``: Home Assistant's text stream (``synthesize-start``, the tokens as
  ``synthesize-chunk``s, ``synthesize-stop``), from the chunk that completes the first sentence
  (for a one-sentence text, the ``synthesize-stop``) to the first ``audio-chunk``.

Tokens are sent back to back, as from an LLM that writes faster than speech. Each WebSocket
session and Wyoming connection is opened (and, for the WebSocket, started) before its clock
starts, as an agent holds one open. "Last audio" is the time, on the same clock, to the last
audio-carrying message (the end of the HTTP body). The clock is this client's, on loopback, so it
includes the client libraries (httpx, ``websockets``, the ``wyoming`` package's
``AsyncTcpClient``, the ones the tests use) and the JSON and base64 of the messages.

A benchmark, not a test: it prints a markdown table and never fails on a number. Run from the
repository root (needs the ``test`` extra)::

    python benchmarks/agents_bench.py [--rounds 30] [--engines-dir DIR]

Results go to ``benchmarks/results/agents_bench.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect
from wyoming.client import AsyncTcpClient
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop

from bench_common import (
    DEFAULT_CORPUS,
    DEFAULT_ENGINES,
    HOST,
    RESULTS,
    SERVER_LOG_DIR,
    Server,
    fmt,
    free_port,
    load_corpus,
    machine_info,
    pct,
    relative,
    utc_timestamp,
    write_atomic,
    write_json,
)
from ttsvc.compile.build import ensure_default_voice

APIS = ("http", "sse", "ws flush", "ws tokens", "wyoming", "wyoming stream")
READ_TIMEOUT_S = 120.0
"""Per message: far above any answer on an idle machine, so only a hung server trips it."""


@dataclass
class Sample:
    """Seconds from the clock's start to the first and to the last audio of one request."""

    first: float
    last: float


class Clock:
    """One request's stopwatch: ``start`` once the text goes out, ``audio`` at each message that
    carries audio (the first and the last are kept)."""

    def __init__(self) -> None:
        self.started: float | None = None
        self.first: float | None = None
        self.last: float | None = None

    def start(self) -> None:
        self.started = time.perf_counter()

    def audio(self) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        self.last = now

    def sample(self) -> Sample:
        if self.started is None or self.first is None or self.last is None:
            raise RuntimeError("no audio, or the clock never started")
        if self.first < self.started:
            raise RuntimeError("audio before the sentence was complete")
        return Sample(self.first - self.started, self.last - self.started)


def tokens(text: str) -> list[str]:
    """Word-sized tokens with their leading space, as an LLM streams them."""
    words = text.split(" ")
    return [words[0], *(" " + word for word in words[1:])]


def completing_token(pieces: list[str]) -> int | None:
    """Index of the token that completes the first sentence: the one after the token ending in
    a full stop, question or exclamation mark (the segmenter needs text after a sentence's end
    to know it ended); None where that is the stream's end (one sentence)."""
    for i, piece in enumerate(pieces[:-1]):
        if piece.rstrip().endswith((".", "?", "!")):
            return i + 1
    return None


# --------------------------------------------------------------------------- one request per API


async def http_once(client: httpx.AsyncClient, text: str) -> Sample:
    clock = Clock()
    clock.start()
    async with client.stream("POST", "/synthesize", json={"text": text, "format": "pcm"}) as r:
        r.raise_for_status()
        async for piece in r.aiter_raw():
            if piece:
                clock.audio()
    return clock.sample()


async def sse_once(client: httpx.AsyncClient, text: str) -> Sample:
    body = {"model": "tts-1", "voice": "alloy", "input": text, "response_format": "pcm",
            "stream_format": "sse"}  # fmt: skip
    clock = Clock()
    clock.start()
    async with client.stream("POST", "/v1/audio/speech", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "speech.audio.delta" and base64.b64decode(event["audio"]):
                clock.audio()
            elif event["type"] == "speech.audio.done":
                break
            elif event["type"] != "speech.audio.delta":
                raise RuntimeError(f"unexpected event: {event}")
    return clock.sample()


async def ws_once(url: str, text: str, by_token: bool) -> Sample:
    clock = Clock()
    async with connect(url, open_timeout=30, max_size=None) as ws:
        await ws.send(json.dumps({"type": "start"}))
        started = json.loads(await asyncio.wait_for(ws.recv(), READ_TIMEOUT_S))
        if started.get("type") != "started":
            raise RuntimeError(f"session not started: {started}")
        reader = asyncio.create_task(_ws_read(ws, clock))
        if by_token:
            pieces = tokens(text)
            at = completing_token(pieces)
            for i, piece in enumerate(pieces):
                if i == at:
                    clock.start()
                await ws.send(json.dumps({"type": "append", "text": piece}))
            if at is None:
                clock.start()
        else:
            clock.start()
            await ws.send(json.dumps({"type": "append", "text": text}))
        await ws.send(json.dumps({"type": "flush"}))
        await asyncio.wait_for(reader, READ_TIMEOUT_S)
        await ws.send(json.dumps({"type": "end"}))
    return clock.sample()


async def _ws_read(ws: ClientConnection, clock: Clock) -> None:
    """Messages until ``flushed`` (sent once all audio before the flush went out)."""
    while True:
        message = json.loads(await ws.recv())
        if message["type"] == "audio":
            clock.audio()
        elif message["type"] == "flushed":
            return
        elif message["type"] == "error":
            raise RuntimeError(f"session error: {message}")


async def wyoming_once(port: int, text: str, streamed: bool) -> Sample:
    clock = Clock()
    async with AsyncTcpClient(HOST, port) as tcp:
        reader = asyncio.create_task(_wyoming_read(tcp, clock, streamed))
        if streamed:
            pieces = tokens(text)
            at = completing_token(pieces)
            await tcp.write_event(SynthesizeStart().event())
            for i, piece in enumerate(pieces):
                if i == at:
                    clock.start()
                await tcp.write_event(SynthesizeChunk(text=piece).event())
            if at is None:
                clock.start()
            await tcp.write_event(SynthesizeStop().event())
        else:
            clock.start()
            await tcp.write_event(Synthesize(text=text).event())
        await asyncio.wait_for(reader, READ_TIMEOUT_S)
    return clock.sample()


async def _wyoming_read(tcp: AsyncTcpClient, clock: Clock, streamed: bool) -> None:
    """Events until ``audio-stop`` (``synthesize-stopped`` for a text stream)."""
    until = "synthesize-stopped" if streamed else "audio-stop"
    while (event := await tcp.read_event()) is not None:
        if event.type == "audio-chunk":
            clock.audio()
        elif event.type == "error":
            raise RuntimeError(f"wyoming error: {event.data}")
        elif event.type == until:
            return
    raise RuntimeError("wyoming connection closed before the end of the audio")


# --------------------------------------------------------------------------- the run


async def measure(server: Server, wyoming_port: int, texts: dict[str, str], rounds: int,
                  warmup: int) -> dict[tuple[str, str], list[Sample]]:  # fmt: skip
    ws_url = server.base_url.replace("http://", "ws://") + "/synthesize/stream"
    found: dict[tuple[str, str], list[Sample]] = {(a, t): [] for t in texts for a in APIS}
    kinds = list(found)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=READ_TIMEOUT_S,
                                 trust_env=False) as client:  # fmt: skip
        run: dict[str, Callable[[str], Awaitable[Sample]]] = {
            "http": lambda text: http_once(client, text),
            "sse": lambda text: sse_once(client, text),
            "ws flush": lambda text: ws_once(ws_url, text, by_token=False),
            "ws tokens": lambda text: ws_once(ws_url, text, by_token=True),
            "wyoming": lambda text: wyoming_once(wyoming_port, text, streamed=False),
            "wyoming stream": lambda text: wyoming_once(wyoming_port, text, streamed=True),
        }
        for i in range(warmup + rounds):
            shift = i % len(kinds)
            for api, name in kinds[shift:] + kinds[:shift]:
                sample = await run[api](texts[name])
                if i >= warmup:
                    found[(api, name)].append(sample)
            if i + 1 == warmup or (i >= warmup and (i + 1 - warmup) % 10 == 0):
                done = i + 1 - warmup
                print(f"  {'warm-up done' if done == 0 else f'{done}/{rounds} rounds'}",
                      file=sys.stderr)  # fmt: skip
    return found


def summary(values: list[float]) -> dict[str, float | None]:
    ms = [1000 * v for v in values]
    return {"p50_ms": pct(ms, 50), "p90_ms": pct(ms, 90),
            "mean_ms": statistics.fmean(ms) if ms else None}  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| text | API | n | first audio p50 ms | p90 ms | mean ms "
             "| last audio p50 ms | p90 ms | mean ms |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        f, last = r["first_audio"], r["last_audio"]
        lines.append(
            f"| {r['text']} | {r['api']} | {r['n']} | {fmt(f['p50_ms'])} | {fmt(f['p90_ms'])} "
            f"| {fmt(f['mean_ms'])} | {fmt(last['p50_ms'])} | {fmt(last['p90_ms'])} "
            f"| {fmt(last['mean_ms'])} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--rounds",
        type=int,
        default=30,
        help="measured rounds, each one request per API and text (default 30)",
    )
    parser.add_argument(
        "--warmup", type=int, default=2, help="rounds run first and not counted (default 2)"
    )
    parser.add_argument(
        "--engines-dir",
        type=Path,
        default=DEFAULT_ENGINES,
        help=f"engines directory (default: {relative(DEFAULT_ENGINES)})",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker processes (default: the service's own choice)",
    )
    parser.add_argument(
        "--corpus",
        type=Path,
        default=DEFAULT_CORPUS,
        help=f"where the default texts come from (default: {relative(DEFAULT_CORPUS)})",
    )
    parser.add_argument(
        "--short", default=None, help="the one-sentence reply (default: the corpus's first line)"
    )
    parser.add_argument(
        "--long",
        default=None,
        help="the three-sentence reply (default: the corpus's first three lines)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "agents_bench.json",
                        help="JSON result; the markdown goes next to it as .md "
                        "(default: benchmarks/results/agents_bench.json)")  # fmt: skip
    args = parser.parse_args()

    corpus = load_corpus(args.corpus)
    texts = {"short": args.short or corpus[0], "long": args.long or " ".join(corpus[:3])}
    ensure_default_voice(args.engines_dir, lambda m: print(m, file=sys.stderr))
    load_before = os.getloadavg()
    wyoming_port = free_port()
    server = Server(
        args.engines_dir,
        args.workers,
        SERVER_LOG_DIR / "agents_bench.log",
        extra_args=["--wyoming-port", str(wyoming_port), "--metrics-port", "0"],
    )
    try:
        server.wait_ready(lambda c: c.get("/health").status_code == 200, timeout_s=600,
                          poll_timeout_s=1, interval_s=0.2)  # fmt: skip
        workers = server.worker_count()
        found = asyncio.run(measure(server, wyoming_port, texts, args.rounds, args.warmup))
    finally:
        code = server.stop()
    load_after = os.getloadavg()

    rows: list[dict[str, Any]] = []
    for name in texts:
        for api in APIS:
            samples = found[(api, name)]
            rows.append({"text": name, "api": api, "n": len(samples),
                         "first_audio": summary([s.first for s in samples]),
                         "last_audio": summary([s.last for s in samples])})  # fmt: skip
    header = (
        f"Time to first and last audio, {args.rounds} rounds after {args.warmup} warm-up, "
        f"{workers} worker(s), pcm; load average {load_before[0]:.2f} before, "
        f"{load_after[0]:.2f} after.\n\n"
        + "\n".join(f"- {name} ({len(text)} characters): {text!r}" for name, text in texts.items())
        + "\n"
    )
    markdown = f"{header}\n{table(rows)}\n"
    print(markdown)
    report = {
        "benchmark": "agents_bench",
        "timestamp": utc_timestamp(),
        "machine": machine_info({lib: version(lib) for lib in ("httpx", "websockets", "wyoming")}),
        "args": {"rounds": args.rounds, "warmup": args.warmup, "workers": workers},
        "texts": texts,
        "load_average_1m": {"before": load_before[0], "after": load_after[0]},
        "server_exit_code": code,
        "rows": rows,
    }
    write_json(args.out, report, indent=2)
    write_atomic(args.out.with_suffix(".md"), markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
