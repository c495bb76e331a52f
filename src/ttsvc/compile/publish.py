"""Finishing a staged version: its manifest, the check that it loads, the atomic publish.

Both backends end here. ``publish_ort`` writes the manifest of the ONNX Runtime engines and
loads them as a worker will; ``publish_trt`` first builds the TensorRT plans
(``compile/trt.py``) and holds them to the fp32 reference. Each runs inside ``compile_voice``'s
staging guard (``build.py``): any failure removes the staging directory, and only a version
that loaded is renamed into place.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import onnx

from ttsvc.backends.loader import load_engine_set
from ttsvc.backends.onnxruntime import runtime_fingerprint
from ttsvc.compile.inputs import CompileOptions
from ttsvc.compile.reference import Chain, Reference, snr_db
from ttsvc.compile.split import GraphSplit, SplitEngines
from ttsvc.errors import GraphShapeError
from ttsvc.repository.layout import EngineRepository, EngineVersion
from ttsvc.repository.manifest import (
    FileEntry,
    FrameContext,
    Manifest,
    file_entry,
    sha256_file,
    write_manifest,
)
from ttsvc.voice import VOICE_FILE, VoiceConfig


@dataclass(frozen=True)
class Staged:
    """A version checked and measured in its staging directory, ready for its manifest: what
    either backend's publish needs of ``compile_voice``'s work."""

    opts: CompileOptions
    repo: EngineRepository
    staging: Path
    version: int
    engines: SplitEngines
    reference: Reference
    contexts: dict[str, FrameContext]
    voice: VoiceConfig
    quality: dict[str, float]


def publish_ort(
    staged: Staged, graphs: Iterable[str], precision: dict[str, str], layouts: dict[str, str]
) -> EngineVersion:
    """Write the manifest of the engine files ``graphs`` in ``staging``, load them, publish."""
    opts, staging, reference = staged.opts, staged.staging, staged.reference
    files = {name: file_entry(staging / name) for name in [*graphs, VOICE_FILE]}
    manifest = version_manifest(opts, staged.version, precision, staged.voice, reference.hop,
                                staged.contexts, files, staged.engines.split,
                                {"onnx": onnx.__version__, **runtime_fingerprint()})  # fmt: skip
    manifest.latent_channels = int(reference.frames[0].shape[1])
    manifest.quality.update(staged.quality)
    manifest.layout = layouts
    write_manifest(staging, manifest)
    load_engine_set(staging)  # the published set must load exactly as workers will load it
    return staged.repo.publish(opts.voice, staging, staged.version)


def publish_trt(staged: Staged, chain: Chain) -> EngineVersion:
    """Build the plans into ``staging``, check them against the fp32 reference, publish.

    Runs inside ``compile_voice``'s staging guard: any failure removes the staging directory.
    """
    from ttsvc.compile import trt  # noqa: PLC0415

    opts, staging, reference = staged.opts, staged.staging, staged.reference
    engines, contexts = staged.engines, staged.contexts
    channels = int(reference.frames[0].shape[1])
    build = trt.build_plans(
        staging=staging, voice_dir=staged.repo.root / opts.voice, engines=engines,
        contexts=contexts,
        channels=channels, quantize=opts.quantize, max_batch=opts.max_batch,
        seq_len=opts.seq_len, schedule=opts.schedule, log=opts.log,
    )  # fmt: skip
    files = {name: file_entry(staging / name) for name in [*build.files, VOICE_FILE]}
    manifest = version_manifest(opts, staged.version, build.precision, staged.voice,
                                reference.hop, contexts, files, engines.split,
                                {"onnx": onnx.__version__, **build.runtime})  # fmt: skip
    manifest.latent_channels = channels
    manifest.max_batch = opts.max_batch
    manifest.profiles = build.profiles
    manifest.quality.update(staged.quality | build.quality)
    write_manifest(staging, manifest)
    plans = load_engine_set(staging)  # loads exactly as workers will
    scores = trt.plan_quality(plans, reference.ids, reference.latents, reference.frames,
                              reference.audio, chain.flow, chain.vocoder, snr_db,
                              reference.length_scale)  # fmt: skip
    for key, db in sorted(scores.items()):
        opts.log(f"{key.removesuffix('_snr_db')}: {db:.1f} dB SNR against fp32 ONNX Runtime")
    low = {k: v for k, v in scores.items() if v < opts.min_snr_db}
    if low:
        raise GraphShapeError(
            f"TensorRT plans fall below {opts.min_snr_db} dB SNR against ONNX Runtime: {low}"
        )
    manifest.quality.update(scores)
    write_manifest(staging, manifest)
    published = staged.repo.publish(opts.voice, staging, staged.version)
    opts.log(f"published {published.path}")
    return published


def version_manifest(
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
    """The manifest of the version ``opts`` builds (callers fill in what the build measured)."""
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
        speed_durations=split.follows_speed,
        streaming=opts.streaming,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
