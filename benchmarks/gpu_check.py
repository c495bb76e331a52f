"""One script for an operator on an NVIDIA machine: build the TensorRT plans, check them against
ONNX Runtime, and measure time to first audio and throughput at 1, 6 and 32 concurrent streams.

    pip install -e '.[dev,trt]'        # TensorRT 10 + cuda-python (NVIDIA's index for TensorRT)
    python benchmarks/gpu_check.py     # writes benchmarks/results/gpu_check.json

What it measures: one worker's scheduler in-process (``DeadlineScheduler`` on one compute
thread, measured with the canary and batching up to the plans' ``max_batch``, as a worker builds
it), ``c`` streams arriving together, run to the end. TTFA is from a stream's arrival to its
first chunk; throughput is seconds of audio per wall second (RTFx); "batch" is the mean number
of streams one step served (a fresh stream's first step, its front end, acoustic run and first
window, always runs alone). No HTTP, no IPC: this is the engine side of the service. Riva
publishes 21 ms TTFA and 366x real time at 6 streams (its FastPitch + HiFi-GAN on a datacenter
GPU): the number to beat.

Exits 2 with the reason where there is no GPU, TensorRT or cuda-python; 1 when the plans fall
below the SNR bar against the fp32 ONNX Runtime engines.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench_common import (
    DEFAULT_CORPUS,
    HERE,
    RESULTS,
    fmt,
    load_corpus,
    machine_info,
    pct,
    relative,
    utc_timestamp,
    write_json,
)
from ttsvc.backends import gpu as gpu_probe
from ttsvc.backends.loader import load_engine_set
from ttsvc.compile.build import compile_voice, default_checkpoint
from ttsvc.compile.inputs import CompileOptions
from ttsvc.compile.reference import snr_db
from ttsvc.config import DEFAULT_VOICE
from ttsvc.errors import TTSError
from ttsvc.protocol import AudioChunkMsg, FromWorker, StreamDone, StreamError, SynthesisJob
from ttsvc.synthesis import SynthesisParams, Synthesizer
from ttsvc.worker.batching import batch_limit
from ttsvc.worker.costs import measure
from ttsvc.worker.deadline import DeadlineScheduler
from ttsvc.worker.deadline_policy import Live
from ttsvc.worker.streams import Send

RIVA = {"streams": 6, "ttfa_ms": 21.0, "rtfx": 366.0}
"""NVIDIA Riva's published figures for 6 concurrent streams: what to beat."""
MIN_SNR_DB = 40.0
CONCURRENCY = (1, 6, 32)
DET = SynthesisParams(noise_scale=0.0, noise_w=0.0)
STREAM_TIMEOUT_S = 300.0
"""How long a run waits for any one stream to end before it gives up."""


def build(engines: Path, max_batch: int, seq_len: int, log: bool) -> tuple[Path, Path]:
    """Compile the default voice twice: fp32 ONNX Runtime (the reference) and fp16 plans."""
    model, config = default_checkpoint()

    def say(msg: str) -> None:
        if log:
            print(f"  {msg}")

    started = time.perf_counter()
    cpu = compile_voice(CompileOptions(model, config, engines / "ort", DEFAULT_VOICE, log=say))
    gpu = compile_voice(CompileOptions(model, config, engines / "trt", DEFAULT_VOICE,
                                       quantize="fp16", max_batch=max_batch, seq_len=seq_len,
                                       backend="trt", min_snr_db=MIN_SNR_DB, log=say))  # fmt: skip
    print(f"built both engine sets in {time.perf_counter() - started:.0f} s")
    return cpu.path, gpu.path


def quality(cpu: Synthesizer, gpu: Synthesizer, prompts: list[str]) -> list[float]:
    """SNR (dB) of each prompt's streamed audio, plans against fp32 ONNX Runtime."""
    scores = []
    for text in prompts:
        expected = np.concatenate([c.samples for c in cpu.stream(text, DET)]).astype(np.float64)
        got = np.concatenate([c.samples for c in gpu.stream(text, DET)]).astype(np.float64)
        scores.append(snr_db(expected, got) if got.shape == expected.shape else -1.0)
    return scores


def run_streams(
    synth: Synthesizer, prompts: list[str], streams: int, costs: tuple[float, float, float]
) -> dict[str, Any]:
    """``streams`` streams arriving together on one worker's scheduler, run to the end.

    ``costs``: the canary's figures (``worker.costs.measure``), which the scheduler's admission
    and step bounds start from, as in a worker."""
    rate, first_chunk_s, per_char = costs
    scheduler = DeadlineScheduler(synth, threads=1, per_thread=rate, first_chunk_s=first_chunk_s,
                                  audio_per_char=per_char,
                                  max_batch=batch_limit(synth.engines))  # fmt: skip
    sizes: list[int] = []
    step = scheduler.step

    def counted_step(stream: Live, send: Send, riders: Sequence[Live] = ()) -> None:
        sizes.append(1 + len(riders))  # one compute thread: no other step appends meanwhile
        step(stream, send, riders)

    scheduler.step = counted_step  # type: ignore[method-assign]  # its thread calls self.step
    arrived: dict[str, float] = {}
    first: dict[str, float] = {}
    samples = 0
    failed = 0
    ended = threading.Semaphore(0)

    def send(msg: FromWorker) -> None:
        nonlocal samples, failed
        if isinstance(msg, AudioChunkMsg):
            first.setdefault(msg.uid, time.perf_counter())
            samples += len(msg.pcm) // 2
            return
        if isinstance(msg, StreamError):
            failed += 1
        elif not isinstance(msg, StreamDone):
            raise AssertionError(f"unexpected message {msg!r}")
        ended.release()

    scheduler.start(send)
    try:
        started = time.perf_counter()
        with scheduler.lock:  # all arrive before the compute thread picks any
            for i in range(streams):
                uid = f"s{i}"
                arrived[uid] = time.perf_counter()
                scheduler.add(SynthesisJob(uid, prompts[i % len(prompts)], 1.0, 0.667, 0.8, 0.2))
        for _ in range(streams):
            if not ended.acquire(timeout=STREAM_TIMEOUT_S):
                raise RuntimeError(f"a stream did not end within {STREAM_TIMEOUT_S:g} s")
        wall = time.perf_counter() - started
    finally:
        scheduler.close()
    ttfa = [1000 * (first[uid] - arrived[uid]) for uid in first]
    audio_s = samples / synth.sample_rate
    return {
        "streams": streams,
        "ttfa_ms_p50": pct(ttfa, 50),
        "ttfa_ms_p95": pct(ttfa, 95),
        "ttfa_ms_max": max(ttfa) if ttfa else None,
        "audio_s": audio_s,
        "wall_s": wall,
        "rtfx": audio_s / wall if wall > 0 else None,
        "mean_batch": float(np.mean(sizes)) if sizes else None,
        "failed": failed,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines-dir", type=Path, default=HERE / ".cache" / "gpu-engines")
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3, help="runs per concurrency (best kept)")
    parser.add_argument("--output", type=Path, default=RESULTS / "gpu_check.json")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args()

    reason = gpu_probe.gpu_unavailable_reason()
    if reason is not None:
        print(f"gpu_check: cannot run here: {reason}", file=sys.stderr)
        return 2
    gpu_info = gpu_probe.gpu_info()
    print(f"GPU: {gpu_info.name} (sm {gpu_info.compute_capability}, CUDA {gpu_info.cuda_runtime})")
    prompts = load_corpus(args.corpus)
    try:
        cpu_path, gpu_path = build(args.engines_dir, args.max_batch, args.seq_len, not args.quiet)
    except TTSError as exc:  # e.g. the plans fell below the SNR bar at compile time
        print(f"gpu_check: build failed: {exc.message}", file=sys.stderr)
        return 1
    cpu = Synthesizer(load_engine_set(cpu_path))
    gpu = Synthesizer(load_engine_set(gpu_path))
    scores = quality(cpu, gpu, prompts)
    print(f"SNR plans vs ONNX Runtime over {len(scores)} prompts: min {min(scores):.1f} dB, "
          f"median {float(np.median(scores)):.1f} dB (bar: {MIN_SNR_DB} dB)")  # fmt: skip
    gpu.calibrate()  # as a worker does: window growth follows this GPU's speed
    costs = measure(gpu)  # and its scheduler starts from the canary's figures
    run_streams(gpu, prompts, 2, costs)  # warm-up: first calls allocate buffers and contexts
    rows = []
    for streams in CONCURRENCY:
        runs = [run_streams(gpu, prompts, streams, costs) for _ in range(args.rounds)]
        rows.append(min(runs, key=lambda r: r["ttfa_ms_p50"] or float("inf")))
    print(f"\n{'streams':>7} {'TTFA p50':>9} {'p95':>7} {'max':>7} {'RTFx':>7} {'batch':>6}")
    for row in rows:
        print(f"{row['streams']:>7} {fmt(row['ttfa_ms_p50']):>9} {fmt(row['ttfa_ms_p95']):>7} "
              f"{fmt(row['ttfa_ms_max']):>7} {fmt(row['rtfx'], 0):>7} "
              f"{fmt(row['mean_batch']):>6}")  # fmt: skip
    six = next(r for r in rows if r["streams"] == RIVA["streams"])
    beat = (six["ttfa_ms_p50"] or 1e9) <= RIVA["ttfa_ms"] and (six["rtfx"] or 0) >= RIVA["rtfx"]
    print(f"Riva at 6 streams: {RIVA['ttfa_ms']} ms, {RIVA['rtfx']}x -> "
          f"{'beaten' if beat else 'not beaten'}")  # fmt: skip
    manifest = json.loads((gpu_path / "manifest.json").read_text(encoding="utf-8"))
    result = {
        "date": utc_timestamp(),
        "machine": machine_info({"tensorrt": manifest["runtime"]["tensorrt"]}),
        "gpu": vars(gpu_info),
        "engines": relative(gpu_path),
        "precision": manifest["precision"],
        "max_batch": args.max_batch,
        "snr_db": {"min": min(scores), "median": float(np.median(scores)), "bar": MIN_SNR_DB},
        "compile_quality": manifest["quality"],
        "concurrency": rows,
        "riva": RIVA,
        "riva_beaten_at_6": beat,
    }
    write_json(args.output, result, indent=2)
    print(f"wrote {relative(args.output)}")
    return 0 if min(scores) >= MIN_SNR_DB else 1


if __name__ == "__main__":
    sys.exit(main())
