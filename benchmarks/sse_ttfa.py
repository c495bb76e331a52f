"""Time to first audio of OpenAI's speech events against the plain audio stream, side by side.

Why this exists: ``stream_format: "sse"`` wraps the same encoded audio in base64 events; a voice
agent cares whether the wrapping delays the first sound. One server (one worker) answers the
same text both ways, alternating request by request so both see the same machine, and the time
from sending the request to the first audio the client can play is compared: the first body
bytes of the audio stream, the first decoded ``speech.audio.delta`` of the events. PCM at 24 kHz
in both, so no codec delay is measured.

A benchmark, not a test: it prints a table and never fails on a number. Run from the repository
root::

    python benchmarks/sse_ttfa.py --repeat 10
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench_common import DEFAULT_ENGINES, Server, pct
from ttsvc.compile.build import ensure_default_voice

TEXT = "Sure, I can help with that. Your table for four is booked for seven tonight."


def first_audio_s(client: httpx.Client, stream_format: str) -> float:
    """Seconds from sending the request to the first playable audio bytes."""
    body = {"model": "gpt-4o-mini-tts", "voice": "alloy", "input": TEXT,
            "response_format": "pcm", "stream_format": stream_format}  # fmt: skip
    started = time.perf_counter()
    first = None
    with client.stream("POST", "/v1/audio/speech", json=body) as r:
        r.raise_for_status()
        if stream_format == "audio":
            for piece in r.iter_raw():
                if piece and first is None:
                    first = time.perf_counter() - started
        else:
            for line in r.iter_lines():
                if first is None and line.startswith("data: "):
                    event = json.loads(line[6:])
                    if event["type"] == "speech.audio.delta" and base64.b64decode(event["audio"]):
                        first = time.perf_counter() - started
    assert first is not None
    return first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=10, help="requests of each kind (10)")
    parser.add_argument("--engines-dir", type=Path, default=DEFAULT_ENGINES,
                        help=f"engines directory (default: {DEFAULT_ENGINES.name})")  # fmt: skip
    args = parser.parse_args()
    ensure_default_voice(args.engines_dir, print)
    log = Path(tempfile.mkdtemp(prefix="sse-ttfa-")) / "server.log"
    server = Server(args.engines_dir, 1, log)
    try:
        server.wait_ready(lambda c: c.get("/health").status_code == 200, timeout_s=300,
                          poll_timeout_s=0.5, interval_s=0.2)  # fmt: skip
        times: dict[str, list[float]] = {"audio": [], "sse": []}
        with httpx.Client(base_url=server.base_url, timeout=60, trust_env=False) as client:
            for kind in ("audio", "sse"):  # warm-up, not counted
                first_audio_s(client, kind)
            for i in range(args.repeat):
                order = ("audio", "sse") if i % 2 == 0 else ("sse", "audio")
                for kind in order:
                    times[kind].append(first_audio_s(client, kind))
        print(f"text: {len(TEXT)} characters, pcm 24 kHz, 1 worker, {args.repeat} requests each")
        print("| stream_format | TTFA p50 ms | mean ms | p90 ms |")
        print("|---|---|---|---|")
        for kind, values in times.items():
            ms = [1000 * v for v in values]
            print(f"| {kind} | {statistics.median(ms):.1f} | {statistics.fmean(ms):.1f} | "
                  f"{pct(ms, 90) or 0:.1f} |")  # fmt: skip
        ratio = statistics.median(times["sse"]) / statistics.median(times["audio"])
        print(f"sse / audio p50: {ratio:.3f}")
    finally:
        server.proc.terminate()
        server.proc.wait(timeout=60)


if __name__ == "__main__":
    main()
