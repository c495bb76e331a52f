"""`ttsvc compile` output: layout, manifest, atomic publish, refusals."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from ttsvc.backends.base import StreamingEngine
from ttsvc.backends.loader import load_engine_set
from ttsvc.compile.build import compile_voice, default_checkpoint
from ttsvc.compile.inputs import CompileOptions
from ttsvc.compile.reference import (
    CONTEXT_MARGIN,
    FLOAT_NOISE,
    STREAM_TOLERANCE,
    calibrate_context,
    window_error,
)
from ttsvc.errors import BackendUnavailable, InvalidParameter
from ttsvc.repository.layout import EngineRepository, EngineVersion
from ttsvc.repository.manifest import load_manifest, sha256_file
from ttsvc.synthesis import SynthesisParams, Synthesizer
from ttsvc.windows import WindowSchedule


def test_published_layout_and_manifest(default_version: EngineVersion) -> None:
    files = sorted(p.name for p in default_version.path.iterdir())
    # the stateful frame engines, and the plain graphs beside them for whole sentences
    assert files == ["acoustic.onnx", "flow.onnx", "flow_plain.onnx", "manifest.json",
                     "vocoder.onnx", "vocoder_plain.onnx", "voice.json"]  # fmt: skip
    manifest = load_manifest(default_version.path)
    assert manifest.version == default_version.version == 1
    assert manifest.backend == "ort"
    assert manifest.sample_rate == 22050 and manifest.hop_length == 256
    assert manifest.latent_channels == 192
    engines = {"acoustic", "flow", "vocoder", "flow_plain", "vocoder_plain"}
    assert manifest.precision == dict.fromkeys(engines, "fp32")
    # each ONNX Runtime engine in the convolution layout its timing favoured (compile/layout.py)
    assert set(manifest.layout) == engines
    assert set(manifest.layout.values()) <= {"conv1d", "conv2d"}
    assert set(manifest.quality) >= {f"{e}_conv2d_speedup" for e in manifest.layout}
    for name, entry in manifest.files.items():
        path = default_version.path / name
        assert entry.size == path.stat().st_size
        assert entry.sha256 == sha256_file(path)
    assert manifest.runtime["onnxruntime"] and manifest.runtime["machine"]
    # stateful engines: no left context, and what a first window reads past its end (the lag)
    assert manifest.streaming == "stateful"
    assert set(manifest.contexts) == {"flow", "vocoder"}
    for context in manifest.contexts.values():
        assert context.max_abs_error <= STREAM_TOLERANCE
        assert context.left == 0 and 0 < context.right <= 64
    assert manifest.contexts["vocoder"].right < manifest.contexts["flow"].right
    assert manifest.durations and manifest.speed_durations  # compile/speed.py
    # no staging directory left behind
    assert [p.name for p in default_version.path.parent.iterdir()] == ["1"]


def test_context_engines_manifest(context_version: EngineVersion) -> None:
    manifest = load_manifest(context_version.path)
    assert manifest.streaming == "context"
    for context in manifest.contexts.values():
        assert context.max_abs_error <= 1e-5
        assert 0 < context.left <= 64 and 0 < context.right <= 64
    # the decoder's receptive field is the narrower one: that is why it has its own engine
    assert manifest.contexts["vocoder"].right < manifest.contexts["flow"].right
    # plain graphs already: nothing beside them, and they run whole sentences themselves
    assert not any("plain" in name for name in manifest.files)
    engines = load_engine_set(context_version.path)
    assert engines.plain is None and engines.one_shot is not None
    assert engines.one_shot.vocoder is engines.vocoder


def test_a_stateful_version_loads_its_plain_graphs(default_version: EngineVersion) -> None:
    engines = load_engine_set(default_version.path)
    assert engines.plain is not None and engines.one_shot is engines.plain
    assert not isinstance(engines.plain.vocoder, StreamingEngine)
    assert engines.plain.flow is not None and not isinstance(engines.plain.flow, StreamingEngine)


def test_stateful_engines_that_do_not_stream_exactly_fall_back_to_context_engines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A streamed check that misses (here: forced) publishes context engines, and says so."""
    monkeypatch.setattr("ttsvc.compile.build.stream_error", lambda *_args: 1.0)
    said: list[str] = []
    version = compile_voice(_options(tmp_path, log=said.append))
    assert load_manifest(version.path).streaming == "context"
    assert any("stateful engines refused: streamed output differs" in line for line in said)
    assert [p.name for p in version.path.parent.iterdir()] == [str(version.version)]


def _options(out: Path, **kw: object) -> CompileOptions:
    model, config = default_checkpoint()
    return CompileOptions(model, config, out, "v", **kw)  # type: ignore[arg-type]


def test_trt_backend_exits_with_clear_message(tmp_path: Path) -> None:
    with pytest.raises(BackendUnavailable, match="TensorRT"):
        compile_voice(_options(tmp_path, backend="trt"))
    assert not any(tmp_path.iterdir())


def test_fp16_on_cpu_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameter, match="fp16"):
        compile_voice(_options(tmp_path, quantize="fp16"))


@pytest.mark.slow
def test_int8_kept_only_where_quality_holds(tmp_path: Path) -> None:
    published = compile_voice(_options(tmp_path, quantize="int8", min_snr_db=30.0))
    manifest = load_manifest(published.path)
    for engine in ("acoustic", "flow", "vocoder", "flow_plain", "vocoder_plain"):
        snr = manifest.quality[f"{engine}_int8_snr_db"]
        assert manifest.precision[engine] == ("int8" if snr >= 30.0 else "fp32")
    load_engine_set(published.path)


@pytest.mark.slow
def test_second_compile_is_a_new_version_at_the_decoder_split(tmp_path: Path) -> None:
    first = compile_voice(_options(tmp_path))
    second = compile_voice(_options(tmp_path, split_at="decoder"))
    assert (first.version, second.version) == (1, 2)
    repo = EngineRepository(tmp_path)
    assert repo.latest("v") == second
    manifest = load_manifest(second.path)
    assert manifest.split_at == "decoder"
    assert set(manifest.contexts) == {"vocoder"} and "flow.onnx" not in manifest.files
    engines = load_engine_set(second.path)
    assert engines.version == 2 and engines.flow is None
    synth = Synthesizer(engines)  # windows of decoder frames only: still exact
    params = SynthesisParams(noise_scale=0.0, noise_w=0.0)
    (sentence,) = synth.sentences("The decoder split streams exactly too.")
    latents = synth.latents(sentence.ids, params)
    streamed = np.concatenate(list(synth.windows(latents, WindowSchedule(4, 2.0, 32))))
    assert np.max(np.abs(streamed - synth.one_shot(sentence.ids, params))) <= 1e-3


def _convolution(kernel: np.ndarray) -> Callable[[np.ndarray, int], np.ndarray]:
    """A frame-local stage: the same zero-padded convolution along time on every channel."""

    half = (len(kernel) - 1) // 2

    def stage(x: np.ndarray, _speaker: int = 0) -> np.ndarray:
        rows = [np.convolve(row, kernel)[half : half + len(row)] for row in x[0]]
        return np.stack(rows)[None]

    return stage


def _calibration_inputs() -> list[tuple[int, np.ndarray]]:
    rng = np.random.default_rng(5)
    return [(0, rng.standard_normal((1, 3, n)).astype(np.float64)) for n in (150, 230)]


def test_an_exact_receptive_field_gets_no_margin() -> None:
    # a 9-tap kernel reaches 4 frames each way: 4 frames of context reproduce it exactly
    ctx = calibrate_context(_convolution(np.ones(9) / 9), _calibration_inputs(), 1)
    assert (ctx.left, ctx.right) == (4, 4)
    assert ctx.max_abs_error <= FLOAT_NOISE


def test_a_converging_stage_gets_the_margin() -> None:
    # a slowly decaying kernel never becomes exact: the least context meeting the tolerance
    # would fit the calibration inputs only, so the margin is added on each side
    taps = np.exp(-np.abs(np.arange(-60, 61)) / 2.5)
    stage = _convolution(taps / taps.sum())
    ctx = calibrate_context(stage, _calibration_inputs(), 1, tolerance=1e-5)
    least = calibrate_context(stage, _calibration_inputs(), 1, tolerance=1e-5 * 8)
    assert ctx.max_abs_error <= 1e-5
    assert window_error(stage, _calibration_inputs(), 1, ctx.left - CONTEXT_MARGIN,
                                      ctx.right - CONTEXT_MARGIN) > FLOAT_NOISE  # fmt: skip
    assert ctx.left >= least.left and ctx.right >= least.right
