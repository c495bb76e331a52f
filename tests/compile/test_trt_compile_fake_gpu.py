"""`ttsvc compile --backend trt` end to end with the GPU faked: everything but TensorRT itself.

``FakeGpuPlanBuilder`` stands in for TensorRT's builder (its "plan" is the graph it was given,
re-axised) and ``FakeGpuPlan`` for a deserialized plan (ONNX Runtime on the CPU runs it). All
the rest is the real code: the CPU pipeline, profiles, the acoustic fallback, the timing cache,
the manifest, the SNR gate, the atomic publish, and on the loading side the real
``tensorrt.assemble`` with its plan wrappers (batching, windows beyond a profile) driven by the
worker's scheduler, batching.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.worker.test_batching import TEXTS, _drive, _job, _pcm, _sched
from ttsvc.backends import gpu, trt_engine
from ttsvc.backends import onnxruntime as ortb
from ttsvc.backends import tensorrt as trtb
from ttsvc.backends.loader import load_engine_set
from ttsvc.compile import trt_plan
from ttsvc.compile.build import compile_voice, default_checkpoint
from ttsvc.compile.inputs import CompileOptions
from ttsvc.compile.profiles import TensorProfile
from ttsvc.errors import GraphShapeError, InvalidParameter
from ttsvc.repository.layout import EngineRepository
from ttsvc.repository.manifest import load_manifest
from ttsvc.synthesis import SynthesisParams, Synthesizer
from ttsvc.worker.batching import batch_limit

pytestmark = pytest.mark.slow

ROUNDING_LSB = 8
"""PCM steps the fake plans (the split graphs, run as they are) may differ from the CPU engines
by: those may be in the 2-D layout (compile/layout.py), the same arithmetic rounded in another
order, and the acoustic engine's rounding reaches every later sample (8 steps: -72 dB)."""

FINGERPRINT = {"tensorrt": "10.3.0", "cuda_runtime": "12.4", "compute_capability": "8.9",
               "gpu": "fake"}  # fmt: skip


class FakeGpuPlan:
    """A deserialized plan as the wrappers use it (``run``, ``io.outputs``), on ONNX Runtime."""

    def __init__(self, data: bytes, gain: float) -> None:
        self._session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        self._inputs = [i.name for i in self._session.get_inputs()]
        self.outputs = tuple(o.name for o in self._session.get_outputs())
        self.io = self
        self._gain = gain

    def run(self, feeds: dict[str, Any]) -> dict[str, Any]:
        out = self._session.run(None, {name: feeds[name] for name in self._inputs})
        return {name: value * self._gain if name == "output" else value
                for name, value in zip(self.outputs, out, strict=True)}  # fmt: skip


class FakeGpuPlanBuilder:
    """TensorRT's builder and runtime, faked: records what it was asked for."""

    def __init__(self, *, acoustic_fails: bool = False, vocoder_gain: float = 1.0) -> None:
        self.acoustic_fails = acoustic_fails
        self.vocoder_gain = vocoder_gain
        self.built: dict[str, tuple[list[TensorProfile], bool, bytes | None]] = {}

    def build_plan(self, model: bytes, profiles: list[TensorProfile], *, fp16: bool,
                   timing_cache: bytes | None) -> trt_plan.BuiltPlan:  # fmt: skip
        graph = onnx.load_model_from_string(model)
        name = {"input": "acoustic", "latents": "flow", "frames": "vocoder"}[
            graph.graph.input[0].name
        ]
        if name == "acoustic" and self.acoustic_fails:
            raise GraphShapeError("TensorRT could not parse the graph: NonZero (faked)")
        self.built[name] = (profiles, fp16, timing_cache)
        return trt_plan.BuiltPlan(model, (timing_cache or b"") + name.encode(), 3 if fp16 else 0)

    def deserialize(self, data: bytes, path: Path) -> FakeGpuPlan:
        gain = self.vocoder_gain if path.name == trtb.VOCODER_PLAN else 1.0
        return FakeGpuPlan(data, gain)


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> FakeGpuPlanBuilder:
    fake = FakeGpuPlanBuilder()
    info = gpu.GpuInfo("fake", "8.9", "12.4", "12.6")
    monkeypatch.setattr(gpu, "require_gpu", lambda: info)
    monkeypatch.setattr(gpu, "trt_fingerprint", lambda: dict(FINGERPRINT))
    monkeypatch.setattr(trt_plan, "build_plan", fake.build_plan)
    monkeypatch.setattr(trt_engine, "deserialize", fake.deserialize)
    return fake


def _compile(root: Path, **kw: Any) -> Any:
    model, config = default_checkpoint()
    return compile_voice(CompileOptions(model, config, root, "v", quantize="fp16", max_batch=4,
                                        backend="trt", min_snr_db=40.0, **kw))  # fmt: skip


def test_trt_version_published_loaded_by_workers_code_and_built_again_from_its_cache(
    fake_gpu: FakeGpuPlanBuilder, tmp_path: Path, synth: Synthesizer
) -> None:
    published = _compile(tmp_path)
    manifest = load_manifest(published.path)
    assert sorted(manifest.files) == ["acoustic.plan", "flow.plan", "vocoder.plan", "voice.json"]
    assert sorted(p.name for p in published.path.iterdir()) == [
        "acoustic.plan", "flow.plan", "manifest.json", "vocoder.plan", "voice.json"]  # fmt: skip
    assert manifest.backend == "trt" and manifest.max_batch == 4
    assert manifest.precision == {"acoustic": "fp32", "flow": "fp16", "vocoder": "fp16"}
    assert {k: manifest.runtime[k] for k in FINGERPRINT} == FINGERPRINT
    assert manifest.profiles["vocoder"]["frames"][2][0] == 4
    assert manifest.profiles["acoustic"]["input"][2] == [1, 512]
    assert manifest.quality["trt_chain_snr_db"] == 300.0  # identical output, capped for JSON
    assert {name: fp16 for name, (_, fp16, _) in fake_gpu.built.items()} == {
        "acoustic": False, "flow": True, "vocoder": True}  # fmt: skip
    # the timing cache is carried from plan to plan and kept beside the versions
    assert fake_gpu.built["vocoder"][2] == b"acousticflow"
    (cache,) = (tmp_path / "v").glob(".trt-timing-*")
    assert cache.read_bytes() == b"acousticflowvocoder"
    assert [v.version for v in EngineRepository(tmp_path).versions("v")] == [1]

    engines = load_engine_set(published.path)
    assert isinstance(engines.acoustic, trtb.TrtAcoustic)
    gpu_synth = Synthesizer(engines)
    params = SynthesisParams(noise_scale=0.0, noise_w=0.0)
    for text in TEXTS[:2]:
        expected = np.concatenate([c.samples for c in synth.stream(text, params)])
        got = np.concatenate([c.samples for c in gpu_synth.stream(text, params)])
        assert got.shape == expected.shape
        assert int(np.max(np.abs(got.astype(np.int32) - expected))) <= ROUNDING_LSB
    # the scheduler batching over the real plan wrappers (streams of one text: equal windows)
    assert batch_limit(gpu_synth.engines) == 4
    scheduler = _sched(gpu_synth, max_batch=batch_limit(gpu_synth.engines))
    jobs = [_job(f"b{i}") for i in range(4)] + [_job(f"t{i}", t) for i, t in enumerate(TEXTS)]
    for job in jobs:
        scheduler.add(job)
    sent, sizes = _drive(scheduler)
    assert max(sizes) == 4
    for job in jobs:
        expected = np.concatenate([c.samples for c in synth.stream(job.text, params)])
        got = _pcm(sent, job.uid)
        assert got.shape == expected.shape
        assert int(np.max(np.abs(got.astype(np.int32) - expected))) <= ROUNDING_LSB

    # a second build of the voice starts from the timing cache the first one left (one test:
    # each build is a whole compile, the suite's slowest step)
    second = _compile(tmp_path)
    assert second.version == 2
    assert fake_gpu.built["acoustic"][2] == b"acousticflowvocoder"


def test_acoustic_stays_on_onnxruntime_when_tensorrt_cannot_build_it(
    fake_gpu: FakeGpuPlanBuilder, tmp_path: Path
) -> None:
    fake_gpu.acoustic_fails = True
    published = _compile(tmp_path)
    manifest = load_manifest(published.path)
    assert sorted(manifest.files) == ["acoustic.onnx", "flow.plan", "vocoder.plan", "voice.json"]
    assert "acoustic" not in manifest.profiles and manifest.runtime["onnxruntime"]
    engines = load_engine_set(published.path)
    assert isinstance(engines.acoustic, ortb.OrtAcoustic)
    assert isinstance(engines.vocoder, trtb.TrtVocoder)
    assert "--seq-len 512" in gpu.rebuild_command(manifest)


def test_plans_below_the_snr_bar_are_not_published(
    fake_gpu: FakeGpuPlanBuilder, tmp_path: Path
) -> None:
    fake_gpu.vocoder_gain = 1.05  # a plan whose output is off by 5 %: ~26 dB
    with pytest.raises(GraphShapeError, match=r"below 40\.0 dB") as err:
        _compile(tmp_path)
    assert "trt_vocoder_snr_db" in err.value.message
    assert [p.name for p in (tmp_path / "v").iterdir() if not p.name.startswith(".trt")] == []


def test_a_multi_speaker_voice_is_refused_before_any_plan_is_built(
    fake_gpu: FakeGpuPlanBuilder, tmp_path: Path, multi_speaker_checkpoint: tuple[Path, Path]
) -> None:
    model, config = multi_speaker_checkpoint
    with pytest.raises(InvalidParameter, match=r"3 speakers: .* --backend ort") as err:
        compile_voice(CompileOptions(model, config, tmp_path, "v", quantize="fp16",
                                     backend="trt"))  # fmt: skip
    assert err.value.field == "backend"
    assert fake_gpu.built == {} and not any(tmp_path.iterdir())
