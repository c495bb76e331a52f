"""Time to first audio of a sentence over the WebSocket (``/synthesize/stream``) against HTTP
``POST /synthesize``, side by side in one run on one server.

Each round takes one corpus sentence and measures, in a rotating order:

* ``http``: a warm keep-alive connection POSTs the sentence (``format: pcm``); the clock runs
  from the request to the first body byte.
* ``ws flush``: an open session has received the sentence word by word; the clock runs from the
  ``flush`` that ends it to its first audio message.
* ``ws next token``: the same, but the sentence ends as an LLM ends one: the next token
  (``" So"``) arrives, which tells the sentence is complete. A flush then speaks the leftover
  word, outside the clock.

The clock is this client's, on loopback, so it includes the client library and the JSON and
base64 of the WebSocket messages. Run from the repository root (needs the ``test`` extra, for
``websockets`` and ``httpx``):

    python benchmarks/ws_ttfa_bench.py
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import ClientConnection, connect

from bench_common import (
    DEFAULT_CORPUS,
    DEFAULT_ENGINES,
    SERVER_LOG_DIR,
    Server,
    clean,
    fmt,
    load_corpus,
    machine_info,
    pct,
    utc_timestamp,
    write_atomic,
)
from ttsvc.compile.build import ensure_default_voice

VARIANTS = ("http", "ws flush", "ws next token")


def _ws_round(ws: ClientConnection, sentence: str, next_token: bool) -> float:
    """Seconds from the message that completes ``sentence`` to its first audio."""
    words = sentence.split(" ")
    for i, word in enumerate(words):
        ws.send(json.dumps({"type": "append", "text": word if i == 0 else " " + word}))
    started = time.perf_counter()
    if next_token:
        ws.send(json.dumps({"type": "append", "text": " So"}))
    else:
        ws.send(json.dumps({"type": "flush"}))
    first = None
    while True:
        message = json.loads(ws.recv(timeout=120))
        if message["type"] == "audio" and first is None:
            first = time.perf_counter() - started
            if next_token:
                ws.send(json.dumps({"type": "flush"}))  # speaks the leftover word, off the clock
        elif message["type"] == "error":
            raise RuntimeError(f"session error: {message}")
        elif message["type"] == "flushed":
            assert first is not None
            return first


def _http_round(client: httpx.Client, sentence: str) -> float:
    started = time.perf_counter()
    with client.stream("POST", "/synthesize", json={"text": sentence, "format": "pcm"}) as r:
        r.raise_for_status()
        first = None
        for piece in r.iter_raw():
            if piece and first is None:
                first = time.perf_counter() - started
    assert first is not None
    return first


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines-dir", type=Path, default=DEFAULT_ENGINES)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--n", type=int, default=30, help="rounds (default 30)")
    parser.add_argument("--warmup", type=int, default=3, help="rounds not measured (default 3)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--json", type=Path,
                        default=Path("benchmarks/results/ws_ttfa_bench.json"))  # fmt: skip
    args = parser.parse_args()

    ensure_default_voice(args.engines_dir, lambda m: print(m, file=sys.stderr))
    sentences = load_corpus(args.corpus)
    rng = random.Random(args.seed)
    picked = [rng.choice(sentences) for _ in range(args.warmup + args.n)]
    server = Server(args.engines_dir, args.workers, SERVER_LOG_DIR / "ws_ttfa_bench.log")
    results: dict[str, list[float]] = {v: [] for v in VARIANTS}
    try:
        server.wait_ready(lambda c: c.get("/health").status_code == 200, timeout_s=300,
                          poll_timeout_s=1, interval_s=0.2)  # fmt: skip
        ws_url = server.base_url.replace("http://", "ws://") + "/synthesize/stream"
        with httpx.Client(base_url=server.base_url, timeout=120, trust_env=False) as client, \
                connect(ws_url, open_timeout=30) as ws:  # fmt: skip
            ws.send(json.dumps({"type": "start"}))
            json.loads(ws.recv(timeout=30))
            for i, sentence in enumerate(picked):
                order = VARIANTS[i % 3 :] + VARIANTS[: i % 3]  # no variant always goes first
                for variant in order:
                    if variant == "http":
                        seconds = _http_round(client, sentence)
                    else:
                        seconds = _ws_round(ws, sentence, variant == "ws next token")
                    if i >= args.warmup:
                        results[variant].append(seconds)
    finally:
        server.stop()

    rows: list[dict[str, Any]] = []
    for variant, values in results.items():
        ms = [1000 * v for v in values]
        rows.append({"variant": variant, "n": len(ms), "p50_ms": pct(ms, 50),
                     "p90_ms": pct(ms, 90), "mean_ms": sum(ms) / len(ms)})  # fmt: skip
    print(f"time to first audio of one sentence, {args.n} rounds, {args.workers} worker(s)\n")
    print("| variant | n | p50 ms | p90 ms | mean ms |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['n']} | {fmt(r['p50_ms'])} | {fmt(r['p90_ms'])} | "
              f"{fmt(r['mean_ms'])} |")  # fmt: skip
    report = {"benchmark": "ws_ttfa_bench", "timestamp": utc_timestamp(),
              "machine": machine_info({}), "args": {"n": args.n, "warmup": args.warmup,
                                                    "seed": args.seed, "workers": args.workers},
              "rows": rows, "raw_ms": {k: [1000 * v for v in vs] for k, vs in results.items()}}
    write_atomic(args.json, json.dumps(clean(report), indent=2) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
