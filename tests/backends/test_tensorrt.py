"""The TensorRT backend's checks that need no GPU: fingerprints, the loader's dispatch, windows
beyond a plan's profile, and that importing it imports neither TensorRT nor CUDA."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ttsvc.backends import gpu
from ttsvc.backends.base import run_in_windows
from ttsvc.backends.loader import load_engine_set
from ttsvc.errors import BackendUnavailable, EngineError
from ttsvc.repository.layout import EngineVersion
from ttsvc.repository.manifest import Manifest, load_manifest
from ttsvc.synthesis import Synthesizer
from ttsvc.synthesis.params import SynthesisParams

WIDE = "A sentence long enough that its frames span more than two windows of the plan."
"""A real sentence, one call wide."""
HERE = {"tensorrt": "10.3.0", "cuda_runtime": "12.4", "compute_capability": "8.9", "gpu": "L4"}


def _trt_manifest(default_version: EngineVersion, **runtime: str) -> Manifest:
    manifest = load_manifest(default_version.path)
    manifest.backend = "trt"
    manifest.max_batch = 8
    manifest.precision = {"acoustic": "fp32", "flow": "fp16", "vocoder": "fp16"}
    manifest.profiles = {"acoustic": {"input": [[1, 1], [1, 128], [1, 400]]}}
    manifest.runtime = {**HERE, **runtime}
    return manifest


def test_matching_fingerprint_passes(default_version: EngineVersion) -> None:
    gpu.check_trt_fingerprint(Path("v/1"), _trt_manifest(default_version), HERE)


@pytest.mark.parametrize(("key", "built"), [("tensorrt", "10.0.1"), ("compute_capability", "9.0")])
def test_plan_for_another_machine_is_refused_with_the_rebuild_command(
    default_version: EngineVersion, key: str, built: str
) -> None:
    manifest = _trt_manifest(default_version, **{key: built})
    with pytest.raises(EngineError) as err:
        gpu.check_trt_fingerprint(Path("v/1"), manifest, HERE)
    message = err.value.message
    assert f"{key} '{built}' (this machine: '{HERE[key]}')" in message
    assert "ttsvc compile --backend trt --quantize fp16 --max-batch 8 --seq-len 400" in message
    assert f"--voice {manifest.voice}" in message


def test_another_cuda_version_alone_is_not_refused(default_version: EngineVersion) -> None:
    gpu.check_trt_fingerprint(Path("v/1"), _trt_manifest(default_version, cuda_runtime="12.8"),
                              HERE)  # fmt: skip


def test_trt_version_dir_without_tensorrt_is_refused_clearly(
    default_version: EngineVersion, tmp_path: Path
) -> None:
    """The loader dispatches on the manifest's backend; without TensorRT the refusal says so."""
    if gpu.tensorrt_installed():
        pytest.skip("TensorRT is installed: this checks the refusal without it")
    target = tmp_path / "1"
    shutil.copytree(default_version.path, target)
    path = target / "manifest.json"
    raw = json.loads(path.read_text())
    raw["backend"] = "trt"
    path.write_text(json.dumps(raw))
    with pytest.raises(BackendUnavailable, match="TensorRT is not installed"):
        load_engine_set(target)


def test_cpu_version_loads_through_the_dispatching_loader(default_version: EngineVersion) -> None:
    engines = load_engine_set(default_version.path)
    assert engines.manifest.backend == "ort" and engines.version == 1


def test_importing_ttsvc_imports_no_gpu_library() -> None:
    code = (
        "import sys, ttsvc.backends.gpu, ttsvc.backends.tensorrt, ttsvc.backends.trt_engine, "
        "ttsvc.backends.loader, ttsvc.compile.trt, ttsvc.compile.trt_plan, "
        "ttsvc.worker.batching, ttsvc.worker.process\n"
        "bad = [m for m in ('tensorrt', 'cuda', 'cuda.bindings') if m in sys.modules]\n"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("stage", ["flow", "vocoder"])
def test_calls_wider_than_a_profile_are_cut_into_windows(
    context_synth: Synthesizer, stage: str
) -> None:
    """What the plans do for a whole-sentence call beyond their profile (the canary, one-shot
    responses), checked with the CPU context engines (plans are context engines): the windowed
    result equals the direct one.

    On a real sentence's latents, the inputs the compile chose the contexts for (random latents
    are not what the flow sees: a context that is exact for speech may miss on noise by more
    than the bound, and did on one machine)."""
    synth = context_synth
    engine_set = synth.engines
    manifest = engine_set.manifest
    ctx = manifest.contexts[stage]
    params = SynthesisParams(noise_scale=0.0, noise_w=0.0)
    ids = [i for s in synth.sentences(WIDE) for i in s.ids]
    x = synth.latents(ids, params)
    assert x.shape[-1] > 240  # wider than two windows
    if stage == "flow":
        assert engine_set.flow is not None
        run, scale = engine_set.flow.frames, 1
    else:
        x = synth.frames(x)
        run, scale = engine_set.vocoder.waveform, manifest.hop_length
    whole = run(x)
    windowed = run_in_windows(run, x, 120, ctx.left, ctx.right, scale)
    assert windowed.shape == whole.shape
    assert float(np.max(np.abs(windowed - whole))) <= 1e-3
    assert run_in_windows(run, x[..., :100], 120, ctx.left, ctx.right, scale).shape[-1] == (
        100 * scale
    )
