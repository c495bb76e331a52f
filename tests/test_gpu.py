"""The TensorRT path on a real GPU: build, load, audio against ONNX Runtime, batching, hot swap.

Marked ``gpu`` and skipped, with the reason, where TensorRT, cuda-python or a GPU is missing
(everywhere in this project's CI). On an NVIDIA machine with ``pip install -e '.[dev,trt]'``
they run the real compile of the default voice (minutes: TensorRT times its tactics), so
``pytest -m gpu`` is the check to run there; ``benchmarks/gpu_check.py`` adds the numbers.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.gateway.serving import Server, engines_state, wait_engines
from ttsvc.backends import tensorrt as trtb
from ttsvc.backends import trt_engine
from ttsvc.backends.base import EngineSet
from ttsvc.backends.gpu import gpu_unavailable_reason, trt_fingerprint
from ttsvc.backends.loader import load_engine_set
from ttsvc.compile.build import compile_voice, default_checkpoint
from ttsvc.compile.inputs import CompileOptions
from ttsvc.compile.reference import snr_db
from ttsvc.config import DEFAULT_VOICE
from ttsvc.errors import EngineError
from ttsvc.protocol import AudioChunkMsg, FromWorker, SynthesisJob
from ttsvc.repository.layout import EngineVersion
from ttsvc.repository.manifest import load_manifest
from ttsvc.synthesis import SynthesisParams, Synthesizer
from ttsvc.worker.batching import batch_limit
from ttsvc.worker.deadline import DeadlineScheduler

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

MIN_SNR_DB = 40.0
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Is this the right way to the station?",
    "When the sunlight strikes raindrops in the air, they act as a prism and form a rainbow.",
    "Are you calling about an existing order?",
    "Hello.",
    "Numbers like 1,250 and dates like May 3rd are read out in full.",
]
DET = SynthesisParams(noise_scale=0.0, noise_w=0.0)


@pytest.fixture(scope="module")
def gpu() -> None:
    reason = gpu_unavailable_reason()
    if reason is not None:
        pytest.skip(f"no TensorRT GPU here: {reason}")


@pytest.fixture(scope="module")
def trt_root(gpu: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trt-engines")


@pytest.fixture(scope="module")
def trt_version(trt_root: Path) -> EngineVersion:
    model, config = default_checkpoint()
    return compile_voice(CompileOptions(model, config, trt_root, DEFAULT_VOICE, quantize="fp16",
                                        max_batch=8, seq_len=512, backend="trt",
                                        min_snr_db=MIN_SNR_DB))  # fmt: skip


@pytest.fixture(scope="module")
def trt_set(trt_version: EngineVersion) -> EngineSet:
    return load_engine_set(trt_version.path)


def test_build_publishes_plans_with_manifest_and_fingerprint(trt_version: EngineVersion) -> None:
    manifest = load_manifest(trt_version.path)
    assert manifest.backend == "trt" and manifest.max_batch == 8
    assert {"flow.plan", "vocoder.plan", "voice.json"} <= set(manifest.files)
    assert ("acoustic.plan" in manifest.files) != ("acoustic.onnx" in manifest.files)
    assert manifest.precision["flow"] == manifest.precision["vocoder"] == "fp16"
    here = trt_fingerprint()
    for key in ("tensorrt", "compute_capability", "cuda_runtime"):
        assert manifest.runtime[key] == here[key]
    assert manifest.profiles["vocoder"]["frames"][2][0] == 8
    for key, db in manifest.quality.items():
        if key.endswith("_snr_db"):
            assert db >= MIN_SNR_DB, key
    cache = list(trt_version.path.parent.glob(".trt-timing-*"))
    assert len(cache) == 1 and cache[0].stat().st_size > 0
    assert [p.name for p in trt_version.path.parent.iterdir() if p.is_dir()] == ["1"]


def test_streamed_audio_matches_onnxruntime(trt_set: EngineSet, synth: Synthesizer) -> None:
    gpu_synth = Synthesizer(trt_set)
    for text in TEXTS:
        expected = np.concatenate([c.samples for c in synth.stream(text, DET)]).astype(float)
        got = np.concatenate([c.samples for c in gpu_synth.stream(text, DET)]).astype(float)
        assert got.shape == expected.shape, text
        assert snr_db(expected, got) >= MIN_SNR_DB, text


def test_batched_streams_match_onnxruntime(trt_set: EngineSet, synth: Synthesizer) -> None:
    from tests.worker.test_batching import _drive  # noqa: PLC0415
    from tests.worker.test_deadline import FakeClock  # noqa: PLC0415

    gpu_synth = Synthesizer(trt_set)
    assert batch_limit(trt_set) == 8
    scheduler = DeadlineScheduler(gpu_synth, 1, 0.9, 10.0, clock=FakeClock(), step_floor_s=10.0,
                                  max_batch=8)  # fmt: skip
    for i, text in enumerate(TEXTS * 2):
        scheduler.add(SynthesisJob(f"g{i}", text, 1.0, 0.0, 0.0, 0.2))
    sent: list[FromWorker]
    sent, sizes = _drive(scheduler)
    assert max(sizes) > 1
    for i, text in enumerate(TEXTS):
        pcm = b"".join(m.pcm for m in sent if isinstance(m, AudioChunkMsg) and m.uid == f"g{i}")
        got = np.frombuffer(pcm, dtype="<i2").astype(float)
        expected = np.concatenate([c.samples for c in synth.stream(text, DET)]).astype(float)
        assert got.shape == expected.shape and snr_db(expected, got) >= MIN_SNR_DB, text


def test_one_runtime_and_one_deserialization_per_plan(trt_version: EngineVersion,
                                                       trt_set: EngineSet) -> None:  # fmt: skip
    again = load_engine_set(trt_version.path)
    assert len(trt_engine._RUNTIME) == 1
    assert isinstance(again.vocoder, trtb.TrtVocoder) and isinstance(trt_set.vocoder,
                                                                      trtb.TrtVocoder)
    assert again.vocoder.engine is trt_set.vocoder.engine  # deserialized once, shared


def test_plan_for_another_tensorrt_is_refused(trt_version: EngineVersion, tmp_path: Path) -> None:
    copy = tmp_path / "1"
    shutil.copytree(trt_version.path, copy)
    raw = json.loads((copy / "manifest.json").read_text())
    raw["runtime"]["tensorrt"] = "9.9.9"
    (copy / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(EngineError, match="Rebuild them here"):
        load_engine_set(copy)


@pytest.fixture
def served(trt_version: EngineVersion, tmp_path: Path) -> Iterator[tuple[Server, Path]]:
    root = tmp_path / "engines"
    shutil.copytree(trt_version.path, root / DEFAULT_VOICE / "1")
    srv = Server(root, "--workers", "1", env={"TTSVC_COMPILE_DEFAULT_VOICE": "0"})
    try:
        srv.wait_ready(1)
        yield srv, root
    finally:
        srv.stop()


def test_hot_swap_of_a_plan(served: tuple[Server, Path]) -> None:
    """A new plan version is swapped in without a restart; a corrupt plan never serves."""
    srv, root = served
    r = srv.synth("Served from a TensorRT plan.", noise_scale=0.0, noise_w=0.0)
    assert r.status_code == 200 and r.headers["x-engine-version"] == "1"
    voice_dir = root / DEFAULT_VOICE
    staging = voice_dir / ".staging-copy"
    shutil.copytree(voice_dir / "1", staging)
    raw = json.loads((staging / "manifest.json").read_text())
    raw["version"] = 2
    (staging / "manifest.json").write_text(json.dumps(raw))
    staging.rename(voice_dir / "2")
    wait_engines(srv, lambda s: s["current"] == "2", "plan version 2 serving")
    r = srv.synth("Now on version two.", noise_scale=0.0, noise_w=0.0)
    assert r.status_code == 200 and r.headers["x-engine-version"] == "2"

    plan = voice_dir / "2" / "vocoder.plan"
    data = bytearray(plan.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 4096] = b"\xff" * 4096
    plan.rename(plan.with_name("vocoder.plan.bak"))
    plan.write_bytes(bytes(data))
    state = wait_engines(srv, lambda s: s["reloads"].get("rejected") == 1, "corrupt plan refused")
    assert state["current"] == "2"
    r = srv.synth("The good plan still answers.", noise_scale=0.0, noise_w=0.0)
    assert r.status_code == 200 and r.headers["x-engine-version"] == "2"
    assert engines_state(srv)["reloads"].get("ok") == 1  # type: ignore[union-attr]
