"""``ttsvc compile``: split a voice checkpoint into engines and publish them.

Its own module so the compiler (ONNX, ONNX Runtime, TensorRT) stays behind the imports inside
``cmd_compile``: building the parser never loads it.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ttsvc.cli.args import HelpFormatter, document_defaults
from ttsvc.config import DEFAULT_VOICE, Settings
from ttsvc.voice import name_problem


def add_compile(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("compile", help="split a voice checkpoint into engines and publish them",
                       formatter_class=HelpFormatter)  # fmt: skip
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
    p.add_argument("--streaming", choices=["stateful", "context"], default="stateful",
                   help="stateful: frame engines carry their state between a stream's "
                   "windows (each frame computed once); context: each window recomputes a "
                   "context of frames on each side (for comparison; TensorRT plans are "
                   "always context)")  # fmt: skip
    p.add_argument("--min-snr-db", type=float, default=30.0,
                   help="quality an int8 engine must keep against fp32 to be used")  # fmt: skip
    document_defaults(p, skip=("voice",))  # compile names the voice it makes, not a setting


def cmd_compile(args: argparse.Namespace, settings: Settings) -> int:
    from ttsvc.compile.build import compile_voice, default_checkpoint  # noqa: PLC0415
    from ttsvc.compile.inputs import CompileOptions  # noqa: PLC0415

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
    problem = name_problem(voice)  # before any work: the name becomes a directory
    if problem is not None:
        print(f"ttsvc compile: {problem}", file=sys.stderr)
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
            streaming=args.streaming,
            min_snr_db=args.min_snr_db,
            schedule=settings.schedule(),
            log=progress_printer(started),
        )
    )
    print(f"published {published.voice} version {published.version} at {published.path} "
          f"in {time.perf_counter() - started:.1f} s")  # fmt: skip
    return 0


def progress_printer(started: float, command: str = "compile") -> Callable[[str], None]:
    """Progress for the person who typed the command: plain lines on stderr as they happen,
    each with the seconds since ``started`` (so an estimate can be checked against them)."""

    def say(message: str) -> None:
        elapsed = time.perf_counter() - started
        print(f"ttsvc {command}: {elapsed:5.1f} s  {message}", file=sys.stderr, flush=True)

    return say
