"""The ``ttsvc`` command: compile engines, synthesize from the command line, list engines.

Settings are built here, once, from the environment and flags, and passed down.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ttsvc import __version__
from ttsvc.config import DEFAULT_VOICE, Settings
from ttsvc.errors import TTSError
from ttsvc.observability.logs import configure_logging, get_logger


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's default-showing help, except where the help already says its default or the
    default is None (those flags say in words what their unset value means)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "(default" in text or action.default is None or not action.option_strings:
            return text
        return super()._get_help_string(action)


# flag dest -> Settings field, for the flags that feed the settings
_FLAG_FIELDS = {"engines_dir": "engines_dir", "voice": "voice", "threads": "threads",
                "first_window": "first_window_frames", "output_dir": "engines_dir",
                "host": "host", "port": "port", "workers": "workers",
                "compute_threads": "compute_threads", "cpus": "cpus", "scheduler": "scheduler",
                "realtime_load": "realtime_load", "step_floor_ms": "step_floor_ms",
                "metrics_port": "metrics_port", "wyoming_port": "wyoming_port",
                "max_streams_per_worker": "max_streams_per_worker",
                "queue_timeout_s": "queue_timeout_s", "drain_grace_s": "drain_grace_s",
                "idle_timeout_s": "idle_timeout_s", "header_timeout_s": "header_timeout_s",
                "body_timeout_s": "body_timeout_s",
                "multiplex": "multiplex", "window_budget_share": "window_budget_share",
                "api_keys_file": "api_keys_file",
                "default_rpm": "default_rpm",
                "default_audio_s_per_min": "default_audio_s_per_min",
                "default_key_streams": "default_key_streams", "max_audio_s": "max_audio_s",
                "api_docs": "api_docs", "log_format": "log_format",
                "cors_origins": "cors_origins", "voice_memory_mb": "voice_memory_mb"}  # fmt: skip


def _settings_default(field: str) -> str | None:
    """What an unset flag of ``field`` falls back to, for its help (None: no fixed value)."""
    from pydantic_core import PydanticUndefined  # noqa: PLC0415

    info = Settings.model_fields[field]
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
    elif info.default is PydanticUndefined or info.default is None:
        return None
    else:
        value = info.default
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _document_defaults(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """Append the settings' own defaults and variable names to the help of flags left unset
    (default None), so help and behaviour cannot drift apart."""
    for action in parser._actions:
        field = _FLAG_FIELDS.get(action.dest)
        if field is None or action.dest in skip or action.default is not None:
            continue
        env = f"TTSVC_{field.upper()}"
        text = action.help or ""
        if "(default" not in text:
            value = _settings_default(field)
            text += f" (default: {value})" if value is not None else " (default: none)"
        action.help = f"{text}; env {env}"


def _add_compile(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("compile", help="split a voice checkpoint into engines and publish them",
                       formatter_class=_HelpFormatter)  # fmt: skip
    p.add_argument(
        "--checkpoint",
        default="default",
        help="Piper/VITS ONNX voice, or 'default' for the packaged en_US-joe-medium",
    )
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="the voice's JSON config (default: <checkpoint>.json)",
    )
    p.add_argument("--output-dir", type=Path, default=None, help="engine repository root")
    p.add_argument("--voice", default=None, help="voice name (default: checkpoint file stem)")
    p.add_argument("--quantize", choices=["fp32", "fp16", "int8"], default="fp32",
                   help="engine precision (int8 is kept only if it passes --min-snr-db; fp16 is "
                   "for --backend trt)")  # fmt: skip
    p.add_argument("--max-batch", type=int, default=1,
                   help="stream windows per TensorRT call (trt only; try 8)")  # fmt: skip
    p.add_argument("--seq-len", type=int, default=512, help="TensorRT profile phonemes (trt only)")
    p.add_argument("--backend", choices=["ort", "trt"], default="ort",
                   help="ort: ONNX Runtime (CPU); trt: TensorRT plans (NVIDIA GPU)")
    p.add_argument(
        "--split-at",
        choices=["flow", "decoder"],
        default="flow",
        help="where the frame-level engine starts",
    )
    p.add_argument("--min-snr-db", type=float, default=30.0,
                   help="quality an int8 engine must keep against fp32 to be used")  # fmt: skip
    _document_defaults(p, skip=("voice",))  # compile names the voice it makes, not a setting


def _add_synth(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("synth", help="synthesize text to a WAV file through the streaming path",
                       formatter_class=_HelpFormatter)  # fmt: skip
    p.add_argument("text", help="what to say")
    p.add_argument("-o", "--output", type=Path, default=Path("out.wav"), help="WAV file to write")
    p.add_argument("--engines-dir", type=Path, default=None, help="engine repository root")
    p.add_argument("--voice", default=None, help="voice to speak with")
    p.add_argument("--speed", type=float, default=1.0, help="speaking rate (0.25-4)")
    p.add_argument("--noise-scale", type=float, default=None,
                   help="voice variation, 0-2 (default: the voice's config)")
    p.add_argument("--noise-w", type=float, default=None,
                   help="phoneme length variation, 0-2 (default: the voice's config)")
    p.add_argument("--sentence-silence", type=float, default=0.2,
                   help="seconds of silence after each sentence")
    p.add_argument("--speaker", default=None,
                   help="speaker name or id of a multi-speaker voice (default: its first, id 0)")
    p.add_argument("--threads", type=int, default=None, help="ONNX Runtime threads per engine run")
    p.add_argument("--first-window", type=int, default=None, help="frames in the first window")
    _document_defaults(p)


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="run the HTTP service (gateway + worker pool)",
                       formatter_class=_HelpFormatter)  # fmt: skip
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
    p.add_argument("--workers", type=int, default=None,
                   help="worker processes (default: from the CPUs, see --cpus: 1 up to 4 CPUs, "
                   "then ceil(cpus / 4); one per CPU with --scheduler legacy)")
    p.add_argument("--compute-threads", type=int, default=None,
                   help="compute threads per worker process (default: the CPUs spread over the "
                   "workers, ceil(cpus / workers); 1 with --scheduler legacy)")
    p.add_argument("--cpus", type=int, default=None,
                   help="CPUs to plan workers x compute threads for (default: the container's "
                   "cgroup CPU quota, rounded up, bounded by the CPU affinity mask)")
    p.add_argument("--scheduler", choices=["deadline", "legacy"], default=None,
                   help="deadline: compute threads over one queue ordered by playback deadline, "
                   "admission by capacity; legacy: the earlier one-thread scheduler "
                   "(default: deadline)")
    p.add_argument("--realtime-load", type=float, default=None,
                   help="share of a worker's real-time capacity its streams may demand before a "
                   "new stream waits (default 0.9)")
    p.add_argument("--step-floor-ms", type=float, default=None,
                   help="shortest bound the deadline scheduler puts on a step: larger overlaps "
                   "less (throughput), a stream needing a thread waits longer (default 100)")
    p.add_argument("--engines-dir", type=Path, default=None, help="engine repository root")
    p.add_argument("--voice", default=None, help="voice for requests that name none")
    p.add_argument("--threads", type=int, default=None, help="ONNX Runtime threads per engine run")
    p.add_argument("--max-streams-per-worker", type=int, default=None,
                   help="streams a worker process holds, computing or waiting for capacity, "
                   "before 429 (default: 20 per compute thread)")
    p.add_argument("--queue-timeout", type=float, default=None, dest="queue_timeout_s",
                   help="seconds a request may wait for its first audio before 503")
    p.add_argument("--drain-grace", type=float, default=None, dest="drain_grace_s",
                   help="seconds in-flight streams get to finish after SIGTERM")
    p.add_argument("--idle-timeout", type=float, default=None, dest="idle_timeout_s",
                   help="close a connection idle this long, new or kept alive (default 5 s)")
    p.add_argument("--header-timeout", type=float, default=None, dest="header_timeout_s",
                   help="a request's headers must arrive within this (default 10 s)")
    p.add_argument("--body-timeout", type=float, default=None, dest="body_timeout_s",
                   help="a request body must arrive within this of its headers; else 408 "
                        "(default 10 s)")  # fmt: skip
    p.add_argument("--no-multiplex", action="store_false", default=None, dest="multiplex",
                   help="serve one whole request at a time per worker (default: streams "
                   "interleaved window by window)")
    p.add_argument("--window-budget-share", type=float, default=None,
                   help="share of a peer stream's buffered audio a window may take")  # fmt: skip
    p.add_argument("--first-window", type=int, default=None, help="frames in the first window")
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
    p.add_argument("--api-docs", action=argparse.BooleanOptionalAction, default=None,
                   help="serve /docs, /redoc and /openapi.json, behind the key when keys are on "
                   "(default: off; the pages load Swagger UI and ReDoc from a public CDN)")
    p.add_argument("--log-format", choices=["auto", "json", "console"], default=None,
                   help="auto: readable lines on a terminal, JSON lines otherwise")
    p.add_argument("--cors-origin", action="append", default=None, dest="cors_origins",
                   help="allow browser calls from this origin (repeatable; default: none)")
    p.add_argument("--voice-alias", action="append", default=None, dest="voice_aliases",
                   metavar="NAME=VOICE", help="map a voice name to a served voice (repeatable; "
                   "default: OpenAI's voice names to --voice)")
    p.add_argument("--voice-memory-mb", type=float, default=None,
                   help="megabytes the voices a worker holds may take (a medium voice: about "
                   "140); past it the least recently used voice is let go (0: no limit)")
    _document_defaults(p)


def _add_keys(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = sub.add_parser("keys", help="manage API keys: add (prints the key once, stores only "
                          "its hash), list, remove", formatter_class=_HelpFormatter)  # fmt: skip
    actions = keys.add_subparsers(dest="action", required=True)

    def file_flag(p: argparse.ArgumentParser) -> None:
        p.add_argument("--file", type=Path, default=None, dest="api_keys_file",
                       help="the key file (default: $TTSVC_API_KEYS_FILE)")

    add = actions.add_parser("add", help="make a key, print it once, store its hash",
                             formatter_class=_HelpFormatter)  # fmt: skip
    add.add_argument("name", help="what logs and metrics call requests made with this key")
    file_flag(add)
    add.add_argument("--rpm", type=int, default=None, help="requests per minute (default: none)")
    add.add_argument("--audio-s-per-min", type=float, default=None,
                     help="seconds of audio per minute (default: none)")
    add.add_argument("--streams", type=int, default=None,
                     help="concurrent streams (default: the server's default, a fair share)")
    listing = actions.add_parser("list", help="names and limits of the keys (never a key)",
                                 formatter_class=_HelpFormatter)  # fmt: skip
    file_flag(listing)
    remove = actions.add_parser("remove", help="delete a key (a running server drops it at its "
                                "next reload)", formatter_class=_HelpFormatter)  # fmt: skip
    remove.add_argument("name", help="the key's name")
    file_flag(remove)


def _add_engines(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("engines", help="inspect the engine repository",
                       formatter_class=_HelpFormatter)  # fmt: skip
    p.add_argument("action", choices=["ls"], help="ls: voices, versions, checksums")
    p.add_argument("--engines-dir", type=Path, default=None, help="engine repository root")
    _document_defaults(p)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and docs)."""
    parser = argparse.ArgumentParser(prog="ttsvc", description=__doc__,
                                     formatter_class=_HelpFormatter)  # fmt: skip
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_compile(sub)
    _add_synth(sub)
    _add_serve(sub)
    _add_keys(sub)
    _add_engines(sub)
    return parser


def _overrides(args: argparse.Namespace) -> dict[str, object]:
    overrides = {
        field: getattr(args, flag)
        for flag, field in _FLAG_FIELDS.items()
        if getattr(args, flag, None) is not None
    }
    aliases = getattr(args, "voice_aliases", None)
    if aliases:
        overrides["voice_aliases"] = dict(a.partition("=")[::2] for a in aliases)
    return overrides


def cmd_compile(args: argparse.Namespace, settings: Settings) -> int:
    from ttsvc.compile.build import CompileOptions, compile_voice, default_checkpoint  # noqa: PLC0415

    if args.checkpoint == "default":
        checkpoint, config = default_checkpoint()
        voice = args.voice or DEFAULT_VOICE
    else:
        checkpoint = Path(args.checkpoint)
        config = args.config or checkpoint.with_name(checkpoint.name + ".json")
        voice = args.voice or checkpoint.name.removesuffix(".onnx")
    for path in (checkpoint, args.config or config):
        if not Path(path).is_file():
            print(f"ttsvc compile: {path}: no such file", file=sys.stderr)
            return 2
    started = time.perf_counter()
    published = compile_voice(
        CompileOptions(
            checkpoint=checkpoint,
            config=args.config or config,
            output_dir=settings.engines_dir,
            voice=voice,
            quantize=args.quantize,
            max_batch=args.max_batch,
            seq_len=args.seq_len,
            backend=args.backend,
            split_at=args.split_at,
            min_snr_db=args.min_snr_db,
            schedule=settings.schedule(),
            log=_progress_printer(started),
        )
    )
    print(f"published {published.voice} version {published.version} at {published.path} "
          f"in {time.perf_counter() - started:.1f} s")  # fmt: skip
    return 0


def _progress_printer(started: float) -> Callable[[str], None]:
    """Progress for the person who typed the command: plain lines on stderr as they happen,
    each with the seconds since ``started`` (so an estimate can be checked against them)."""

    def say(message: str) -> None:
        elapsed = time.perf_counter() - started
        print(f"ttsvc compile: {elapsed:5.1f} s  {message}", file=sys.stderr, flush=True)

    return say


def resolve_engines(settings: Settings, voice: str) -> Path:
    """The directory of the version that serves ``voice``, compiling the default if needed."""
    from ttsvc.compile.build import ensure_default_voice  # noqa: PLC0415
    from ttsvc.errors import UnknownVoice  # noqa: PLC0415
    from ttsvc.repository.layout import EngineRepository  # noqa: PLC0415

    repo = EngineRepository(settings.engines_dir)
    latest = repo.latest(voice)
    if latest is None and voice == DEFAULT_VOICE and settings.compile_default_voice:
        log = get_logger("engines")
        latest = ensure_default_voice(settings.engines_dir, lambda m: log.info("default", detail=m))
    if latest is None:
        raise UnknownVoice(f"no engines for voice {voice!r} in {settings.engines_dir}")
    return latest.path


def cmd_synth(args: argparse.Namespace, settings: Settings) -> int:
    from ttsvc.audio.wav import write_wav  # noqa: PLC0415
    from ttsvc.backends.loader import load_engine_set  # noqa: PLC0415
    from ttsvc.synthesis import SynthesisParams, Synthesizer  # noqa: PLC0415
    from ttsvc.voice import speaker_id  # noqa: PLC0415

    try:
        params = SynthesisParams(
            speed=args.speed, noise_scale=args.noise_scale, noise_w=args.noise_w,
            sentence_silence=args.sentence_silence,
        )  # fmt: skip
    except ValueError as exc:
        print(f"ttsvc synth: invalid parameter: {exc}", file=sys.stderr)
        return 2
    path = resolve_engines(settings, settings.voice)
    started = time.perf_counter()
    engines = load_engine_set(path, settings.threads)
    loaded = time.perf_counter()
    try:  # names live in the voice's config: known only once its engines are loaded
        params = params.model_copy(update={"speaker": speaker_id(engines.voice, args.speaker)})
    except ValueError as exc:
        print(f"ttsvc synth: invalid parameter: speaker: {exc}", file=sys.stderr)
        return 2
    synth = Synthesizer(engines, settings.schedule(), settings.max_sentence_chars)
    synth.calibrate()
    chunks: list[np.ndarray] = []
    first: float | None = None
    t0 = time.perf_counter()
    for chunk in synth.stream(args.text, params):
        if first is None:
            first = time.perf_counter() - t0
        chunks.append(chunk.samples)
    total = time.perf_counter() - t0
    pcm = np.concatenate(chunks)
    write_wav(args.output, pcm, synth.sample_rate)
    audio_s = len(pcm) / synth.sample_rate
    print(
        f"wrote {args.output} ({audio_s:.2f} s of audio, {len(chunks)} chunks, engines "
        f"{engines.manifest.voice} v{engines.version}): load {1000 * (loaded - started):.0f} ms, "
        f"first chunk {1000 * (first or 0):.1f} ms, real-time factor {total / audio_s:.3f}"
    )
    return 0


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
        workers=settings.workers,
        compute_threads=settings.compute_threads,
        split=f"{settings.workers}x{settings.compute_threads}",  # processes x threads
        scheduler=settings.scheduler,
        cpus=budget.cpus,
        cpus_from=budget.source,
    )
    return serve(settings, settings.voice)


def cmd_keys(args: argparse.Namespace, settings: Settings) -> int:
    from ttsvc.gateway.auth import KeyFileError, parse_keys, remove_key  # noqa: PLC0415
    from ttsvc.gateway.ratelimit import Quota  # noqa: PLC0415

    path = settings.api_keys_file
    if path is None:
        print("ttsvc keys: name the key file with --file or TTSVC_API_KEYS_FILE", file=sys.stderr)
        return 2
    try:
        if args.action == "add":
            return _add_key(args, path)
        if args.action == "remove":
            remove_key(path, args.name)
            print(f"removed key {args.name!r} from {path}", file=sys.stderr)
            return 0
        keys = parse_keys(path.read_text(encoding="utf-8"), str(path), Quota())
    except (KeyFileError, OSError) as exc:
        print(f"ttsvc keys: {exc}", file=sys.stderr)
        return 2
    if not keys:
        print(f"no keys in {path}", file=sys.stderr)
    for key in keys:
        q = key.quota
        limits = [f"{label}={value:g}" for label, value in (
            ("rpm", q.requests_per_minute), ("audio_s_per_min", q.audio_s_per_minute),
            ("streams", q.streams)) if value is not None]  # fmt: skip
        # the hash's first hex digits tell two keys apart; the key itself is never stored
        shown = " ".join(limits) or "server defaults"
        print(f"{key.name}\tsha256:{key.digest.hex()[:12]}\t{shown}")
    return 0


def _add_key(args: argparse.Namespace, path: Path) -> int:
    from ttsvc.gateway.auth import (  # noqa: PLC0415
        KeyFileError,
        append_key,
        key_line,
        new_key,
        parse_keys,
    )
    from ttsvc.gateway.ratelimit import Quota  # noqa: PLC0415

    if (
        (args.rpm is not None and args.rpm < 1)
        or (args.audio_s_per_min is not None and args.audio_s_per_min <= 0)
        or (args.streams is not None and args.streams < 1)
    ):
        print("ttsvc keys: limits must be positive", file=sys.stderr)
        return 2
    key = new_key()
    line = key_line(args.name, key, Quota(args.rpm, args.audio_s_per_min, args.streams))
    if path.exists():
        names = {k.name for k in parse_keys(path.read_text(encoding="utf-8"), str(path),
                                            Quota())}  # fmt: skip
        if args.name in names:
            raise KeyFileError(f"{path}: a key named {args.name!r} exists already")
    append_key(path, line)
    # the only time the key exists outside its holder: stdout, never a log
    print(key)
    print(f"added key {args.name!r} to {path} (only its sha256 is stored)", file=sys.stderr)
    return 0


def cmd_engines(args: argparse.Namespace, settings: Settings) -> int:
    from ttsvc.repository.layout import EngineRepository  # noqa: PLC0415
    from ttsvc.repository.manifest import load_manifest  # noqa: PLC0415

    repo = EngineRepository(settings.engines_dir)
    voices = repo.voices()
    if not voices:
        print(f"no engines in {settings.engines_dir}")
    for voice in voices:
        versions = repo.versions(voice)
        for v in versions:
            m = load_manifest(v.path)
            active = "*" if v is versions[-1] else " "
            sums = " ".join(f"{n}:{e.sha256[:12]}" for n, e in sorted(m.files.items()))
            precision = f"{m.precision['acoustic']}/{m.precision['vocoder']}"
            print(f"{active} {voice} v{v.version} {m.backend} {precision} {m.created_at} {sums}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ttsvc`` console script."""
    args = build_parser().parse_args(argv)
    try:
        settings = Settings(**_overrides(args))  # type: ignore[arg-type]
    except ValueError as exc:
        print(f"ttsvc: invalid settings: {exc}", file=sys.stderr)
        return 2
    # the service's logs are its output (stdout, for Loki); other commands keep stdout for results
    configure_logging(settings.log_level, sys.stdout if args.command == "serve" else None,
                      settings.log_format)  # fmt: skip
    commands = {
        "compile": cmd_compile,
        "synth": cmd_synth,
        "serve": cmd_serve,
        "keys": cmd_keys,
        "engines": cmd_engines,
    }
    try:
        return commands[args.command](args, settings)
    except TTSError as exc:
        print(f"ttsvc {args.command}: {exc.message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
