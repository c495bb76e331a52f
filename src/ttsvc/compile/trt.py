"""`ttsvc compile --backend trt`: TensorRT plans from the same split, contexts and checks as CPU.

The CPU pipeline runs first (split, fp32 reference, measured window contexts): the plans need
the contexts to size their profiles and the reference to be judged against. Then each engine is
parsed from its *unoptimized* split graph (ONNX Runtime's optimized graphs hold contrib ops
TensorRT cannot parse), the frame engines with a symbolic batch axis, and built with one
optimization profile from ``profiles.engine_profiles``. The builder's timing cache lives beside
the versions, under a hidden name the watcher and the repository ignore, keyed by the machine's
fingerprint, so a rebuild on the same machine skips most tactic timing.

FP16 (``--quantize fp16``) applies to flow and vocoder, with overflow-prone layers pinned to
FP32 (``trt_plan.keeps_fp32``); the acoustic plan stays FP32 (durations are rounded up from
``exp``). The acoustic graph is the risky one for TensorRT (data-dependent output length, random
draws, scatter and non-zero ops): if TensorRT cannot build it, the version keeps
``acoustic.onnx`` and workers run it on ONNX Runtime on the CPU, once per sentence, while flow
and vocoder, the frame work that dominates cost, run as plans. The manifest records which.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ttsvc.backends import gpu
from ttsvc.backends import tensorrt as trtb
from ttsvc.backends.base import EngineSet
from ttsvc.backends.onnxruntime import ACOUSTIC_FILE, FLOW_FILE, VOCODER_FILE, runtime_fingerprint
from ttsvc.compile import trt_plan
from ttsvc.compile.profiles import check_limits, engine_profiles
from ttsvc.compile.split import SplitEngines, with_batch_axis
from ttsvc.errors import GraphShapeError, InvalidParameter
from ttsvc.repository.manifest import FrameContext
from ttsvc.windows import WindowSchedule

PLANS = {"acoustic": trtb.ACOUSTIC_PLAN, "flow": trtb.FLOW_PLAN, "vocoder": trtb.VOCODER_PLAN}
ONNX_FILES = {"acoustic": ACOUSTIC_FILE, "flow": FLOW_FILE, "vocoder": VOCODER_FILE}
TIMING_CACHE_PREFIX = ".trt-timing-"
SNR_CAP_DB = 300.0


def check_trt_options(quantize: str, max_batch: int, seq_len: int) -> None:
    """Refuse what cannot work before any heavy step: flags first, then TensorRT and the GPU."""
    if quantize == "int8":
        raise InvalidParameter(
            "--quantize int8 with --backend trt needs activation calibration, which is not "
            "built; use --quantize fp16 (or fp32)",
            field="quantize",
        )
    check_limits(max_batch, seq_len)
    gpu.require_gpu()


@dataclass
class TrtBuild:
    """What the TensorRT step leaves in the staging directory and tells the manifest."""

    files: list[str]
    precision: dict[str, str]
    runtime: dict[str, str]
    profiles: dict[str, dict[str, list[list[int]]]]
    quality: dict[str, float] = field(default_factory=dict)


def timing_cache_path(voice_dir: Path, fingerprint: dict[str, str]) -> Path:
    """The timing cache for this TensorRT release and GPU, beside the voice's versions."""
    key = "|".join(fingerprint[k] for k in ("tensorrt", "compute_capability", "gpu"))
    return voice_dir / f"{TIMING_CACHE_PREFIX}{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def build_plans(
    *,
    staging: Path,
    voice_dir: Path,
    engines: SplitEngines,
    contexts: dict[str, FrameContext],
    channels: int,
    quantize: str,
    max_batch: int,
    seq_len: int,
    schedule: WindowSchedule,
    log: Callable[[str], None],
) -> TrtBuild:
    """Build a plan per engine into ``staging`` and drop the CPU graphs the plans replace."""
    fingerprint = gpu.trt_fingerprint()
    profiles = engine_profiles(max_batch=max_batch, seq_len=seq_len, schedule=schedule,
                               contexts=contexts, channels=channels)  # fmt: skip
    cache_path = timing_cache_path(voice_dir, fingerprint)
    timing = cache_path.read_bytes() if cache_path.is_file() else None
    build = TrtBuild([], {}, dict(fingerprint), {})
    graphs = {"acoustic": engines.acoustic, "flow": engines.flow, "vocoder": engines.vocoder}
    for name, graph in graphs.items():
        if graph is None:
            continue
        model = graph if name == "acoustic" else with_batch_axis(graph)
        # the acoustic plan stays fp32: its frame count is ceil(exp(logw)) (above speed 1, the
        # speed-1 frames shared out over the speed's length: compile/speed.py), and a duration that
        # rounds the other way would shift every later sample; it runs once per sentence
        precision = "fp32" if name == "acoustic" else quantize
        fp16 = precision == "fp16"
        try:
            built = trt_plan.build_plan(model.SerializeToString(), profiles[name],
                                        fp16=fp16, timing_cache=timing)  # fmt: skip
        except GraphShapeError as exc:
            if name != "acoustic":
                raise
            log(f"acoustic: TensorRT could not build it ({exc.message}); it stays on ONNX Runtime")
            build.files.append(ACOUSTIC_FILE)
            build.precision[name] = "fp32"
            build.runtime.update(runtime_fingerprint())
            continue
        (staging / PLANS[name]).write_bytes(built.plan)
        (staging / ONNX_FILES[name]).unlink()
        timing = built.timing_cache
        build.files.append(PLANS[name])
        build.precision[name] = precision
        build.profiles[name] = {p.name: p.as_lists() for p in profiles[name]}
        build.quality[f"trt_{name}_fp32_layers"] = float(built.fp32_layers)
        log(f"{name}: {precision} plan built ({built.fp32_layers} layers kept in fp32)")
    if timing:
        tmp = cache_path.with_name(cache_path.name + ".tmp")
        tmp.write_bytes(timing)
        tmp.replace(cache_path)
    return build


Stage = Callable[[np.ndarray], np.ndarray]


def plan_quality(
    plans: EngineSet,
    ids: list[list[int]],
    latents: list[np.ndarray],
    frames: list[np.ndarray],
    audio: list[np.ndarray],
    cpu_flow: Stage | None,
    cpu_vocoder: Stage,
    snr: Callable[[np.ndarray, np.ndarray], float],
    length_scale: float = 1.0,
) -> dict[str, float]:
    """Worst SNR (dB) over the canaries of each plan alone and of the whole chain, against the
    fp32 ONNX Runtime reference: one engine swapped at a time, so a failure names its engine.
    ``length_scale`` is the one the reference was made at (the voice's)."""
    scales = np.asarray([0.0, length_scale, 0.0], dtype=np.float32)
    worst: dict[str, float] = {}

    def score(key: str, got: np.ndarray, expected: np.ndarray) -> None:
        db = snr(expected, got) if got.shape == expected.shape else -1.0
        # identical output is an infinite SNR, which JSON cannot hold: cap it
        worst[key] = min(worst.get(key, SNR_CAP_DB), round(min(db, SNR_CAP_DB), 2))

    flow = plans.flow
    for seq, lat, frm, wav in zip(ids, latents, frames, audio, strict=True):
        score("trt_vocoder_snr_db", plans.vocoder.waveform(frm), wav)
        if flow is not None:
            score("trt_flow_snr_db", cpu_vocoder(flow.frames(lat)), wav)
        out = plans.acoustic.latents(np.asarray([seq], dtype=np.int64), scales)
        mid = flow.frames(out) if flow is not None else out
        score("trt_chain_snr_db", plans.vocoder.waveform(mid), wav)
        cpu_mid = cpu_flow(out) if cpu_flow is not None else out
        score("trt_acoustic_snr_db", cpu_vocoder(cpu_mid), wav)
    return worst
