"""``ttsvc serve``: run the HTTP service (gateway + worker pool).

Its own module for its many flags, and so the gateway stays behind the import inside
``cmd_serve``; the worker stack is never imported in this process (the workers load it).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ttsvc.cli.args import HelpFormatter, document_defaults
from ttsvc.cli.engines import resolve_engines
from ttsvc.config import Settings
from ttsvc.observability.logs import get_logger


def add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="run the HTTP service (gateway + worker pool)",
                       formatter_class=HelpFormatter)  # fmt: skip
    p.add_argument("--host", default=None,
                   help="address of the API and metrics (default 127.0.0.1: this machine only; "
                   "0.0.0.0 listens on every interface, as the image and the chart set)")
    p.add_argument("--port", type=int, default=None, help="API port (default 9000)")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="Prometheus /metrics port (default 9091, or a free port when 9091 is "
                   "taken and this is not set; 0: off)")
    p.add_argument("--wyoming-port", type=int, default=None,
                   help="serve the Wyoming protocol (Home Assistant) on this port, on --host, "
                   "with no authentication (default 0: off; Home Assistant's usual is 10200)")
    p.add_argument("--wyoming-host", default=None,
                   help="address of the Wyoming port (default: --host); it has no credentials, "
                   "so it may stay on a private interface while the API is public")
    p.add_argument("--wyoming-allow", action="append", default=None, metavar="NETWORK",
                   help="a client address or network that may connect to the Wyoming port "
                   "(default: any; repeatable)")
    p.add_argument("--wyoming-ssml", action=argparse.BooleanOptionalAction, default=None,
                   help="read Wyoming text that starts with <speak as SSML (Home Assistant: "
                   "breaks, say-as, prosody in a message) (default: off, plain text)")
    p.add_argument("--wyoming-max-connections", type=int, default=None,
                   help="Wyoming connections open at once; one more is refused with an error "
                   "event")
    p.add_argument("--ws-max-sessions", type=int, default=None,
                   help="WebSocket sessions open at once, every WebSocket route together; one "
                   "more is refused at the handshake with 429")
    p.add_argument("--ws-idle-timeout", type=float, default=None, dest="ws_idle_timeout_s",
                   help="close a WebSocket session (1008) whose client sent nothing this many "
                   "seconds while nothing was being spoken on it")
    p.add_argument("--workers", type=int, default=None,
                   help="worker processes (default: from the CPUs, see --cpus: 1 up to 4 CPUs, "
                   "then ceil(cpus / 4))")
    p.add_argument("--compute-threads", type=int, default=None,
                   help="compute threads per worker process (default: the CPUs spread over the "
                   "workers, ceil(cpus / workers))")
    p.add_argument("--cpus", type=int, default=None,
                   help="CPUs to plan workers x compute threads for (default: the container's "
                   "cgroup CPU quota, rounded up, bounded by the CPU affinity mask)")
    p.add_argument("--realtime-load", type=float, default=None,
                   help="share of a worker's real-time capacity its streams may demand before a "
                   "new stream waits or is refused (default 0.75)")
    p.add_argument("--overload", choices=["refuse", "queue"], default=None,
                   help="when every worker's real-time capacity is taken: refuse a new stream "
                   "with 429 no_headroom and a Retry-After at once, or queue it on the least "
                   "loaded worker until it has room (default: refuse)")
    p.add_argument("--window-growth", type=float, default=None,
                   help="how much larger each vocoder window of a sentence may be than the one "
                   "before (default 8)")
    p.add_argument("--step-floor-ms", type=float, default=None,
                   help="shortest bound the deadline scheduler puts on a step: larger overlaps "
                   "less (throughput), a stream needing a thread waits longer (default 50)")
    p.add_argument("--whole-sentences", action=argparse.BooleanOptionalAction, default=None,
                   help="run a sentence whole on the plain graphs where its listener can wait "
                   "(a first sentence while other streams wait for admission, a later one "
                   "while the one before plays): more audio per core; --no-whole-sentences "
                   "streams every sentence in windows (default on)")
    p.add_argument("--engines-dir", type=Path, default=None, help="engine repository root")
    p.add_argument("--voice", default=None, help="voice for requests that name none")
    p.add_argument("--threads", type=int, default=None, help="ONNX Runtime threads per engine run")
    p.add_argument("--max-streams-per-worker", type=int, default=None,
                   help="streams a worker process holds, computing or waiting for capacity, "
                   "before 429 (default: 20 per compute thread)")
    p.add_argument("--queue-timeout", type=float, default=None, dest="queue_timeout_s",
                   help="seconds a request may wait for its first audio before 503")
    p.add_argument("--voice-wait", type=float, default=None, dest="voice_wait_s",
                   help="seconds a request for a voice still being verified (just published "
                   "or pulled) waits for it before 503 (default 10; 0: at once)")
    p.add_argument("--drain-grace", type=float, default=None, dest="drain_grace_s",
                   help="seconds in-flight streams get to finish after SIGTERM")
    p.add_argument("--idle-timeout", type=float, default=None, dest="idle_timeout_s",
                   help="close a connection idle this long, new or kept alive (default 5 s)")
    p.add_argument("--header-timeout", type=float, default=None, dest="header_timeout_s",
                   help="a request's headers must arrive within this (default 10 s)")
    p.add_argument("--body-timeout", type=float, default=None, dest="body_timeout_s",
                   help="a request body must arrive within this of its headers; else 408 "
                        "(default 10 s)")  # fmt: skip
    p.add_argument("--first-window", type=int, default=None, help="frames in the first window")
    p.add_argument("--alone-first-window", type=int, default=None,
                   help="frames in the first window of a stream that starts while its worker "
                   "has no other (default 4; 0: always --first-window)")  # fmt: skip
    p.add_argument("--api-keys-file", type=Path, default=None,
                   help="key file (see `ttsvc keys add`); set: bearer keys are required "
                   "(default: none, no keys)")
    p.add_argument("--default-rpm", type=int, default=None,
                   help="requests per minute for keys that set none (default: unlimited)")
    p.add_argument("--default-audio-s-per-min", type=float, default=None,
                   help="audio seconds per minute for keys that set none (default: unlimited)")
    p.add_argument("--default-key-streams", type=int, default=None,
                   help="concurrent streams for keys that set none (default: a fair share of "
                   "the slots)")
    p.add_argument("--max-audio-s", type=float, default=None,
                   help="most audio seconds one request may produce (default 600)")
    p.add_argument("--lexicons-dir", type=Path, default=None,
                   help="where the pronunciation lexicons (PLS files) are read from (default: "
                   "lexicons/ in the engines directory)")
    p.add_argument("--ssml-unknown-elements", choices=["reject", "ignore"], default=None,
                   help="an SSML element ttsvc does not speak: a 422 naming it, or its text "
                   "spoken")
    p.add_argument("--openai-ssml", action=argparse.BooleanOptionalAction, default=None,
                   help="read OpenAI's input as SSML when it starts with <speak")
    p.add_argument("--api-docs", action=argparse.BooleanOptionalAction, default=None,
                   help="serve /docs, /redoc and /openapi.json, behind the key when keys are on "
                   "(default: off; the pages load Swagger UI and ReDoc from a public CDN)")
    p.add_argument("--log-format", choices=["auto", "json", "console"], default=None,
                   help="auto: readable lines on a terminal, JSON lines otherwise")
    p.add_argument("--cors-origin", action="append", default=None, dest="cors_origins",
                   help="allow browser calls from this origin (repeatable) (default: none)")
    p.add_argument("--voice-alias", action="append", default=None, dest="voice_aliases",
                   metavar="NAME=VOICE", help="map a voice name to a served voice (repeatable; "
                   "default: OpenAI's voice names to --voice)")
    p.add_argument("--voice-memory-mb", type=float, default=None,
                   help="megabytes the voices a worker holds may take (a medium voice: about "
                   "140); past it the least recently used voice is let go (0: no limit)")
    p.add_argument("--worker-memory-mb", type=float, default=None,
                   help="most memory one worker process may take (its data-size limit); past "
                   "it the worker fails its request or is replaced, never the whole service "
                   "(default: --voice-memory-mb + 1024, within a container memory limit at most "
                   "its share; 0: no cap)")
    document_defaults(p)


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    from ttsvc.gateway.server import claim_ports, serve  # noqa: PLC0415

    # before the engines: a taken port must not be found after a minute of compiling
    settings = claim_ports(settings)
    path = resolve_engines(settings, settings.voice)
    budget = settings.cpu_budget()
    get_logger("serve").info(
        "serving",
        engines=str(path),
        port=settings.port,
        metrics_port=settings.metrics_port,
        wyoming_port=settings.wyoming_port or None,
        wyoming_host=(settings.wyoming_host or settings.host) if settings.wyoming_port else None,
        workers=settings.workers,
        compute_threads=settings.compute_threads,
        split=f"{settings.workers}x{settings.compute_threads}",  # processes x threads
        cpus=budget.cpus,
        cpus_from=budget.source,
    )
    return serve(settings, settings.voice)
