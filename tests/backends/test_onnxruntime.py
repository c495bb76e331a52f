"""Loading engine sets: verified before parsing, refused with the file named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from tests.engine_files import int8_vocoder, without_durations
from ttsvc.backends.loader import load_engine_set, load_engine_spec
from ttsvc.backends.onnxruntime import CPU_ARENA, _CpuArena
from ttsvc.errors import EngineError, EngineIntegrityError, TimestampsUnavailable
from ttsvc.repository.cache import EngineCache, snapshot
from ttsvc.repository.layout import EngineVersion
from ttsvc.repository.manifest import file_entry, load_manifest, write_manifest
from ttsvc.synthesis import SynthesisParams, Synthesizer


@pytest.fixture
def copy(default_version: EngineVersion, tmp_path: Path) -> Path:
    target = tmp_path / "1"
    shutil.copytree(default_version.path, target)
    return target


def test_compiled_set_loads(default_version: EngineVersion) -> None:
    engines = load_engine_set(default_version.path)
    assert engines.version == 1
    assert engines.voice.sample_rate == 22050


def test_truncated_file_is_refused_naming_it(copy: Path) -> None:
    vocoder = copy / "vocoder.onnx"
    data = vocoder.read_bytes()
    vocoder.write_bytes(data[: len(data) // 2])
    with pytest.raises(EngineIntegrityError, match=r"vocoder\.onnx.*size"):
        load_engine_set(copy)


def test_altered_file_is_refused_naming_it(copy: Path) -> None:
    acoustic = copy / "acoustic.onnx"
    data = bytearray(acoustic.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one flipped byte
    acoustic.write_bytes(bytes(data))
    with pytest.raises(EngineIntegrityError, match=r"acoustic\.onnx.*sha256"):
        load_engine_set(copy)


def test_missing_manifest_is_refused(copy: Path) -> None:
    (copy / "manifest.json").unlink()
    with pytest.raises(EngineError, match="manifest"):
        load_engine_set(copy)


def test_other_machine_fingerprint_is_refused(copy: Path) -> None:
    path = copy / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["runtime"]["machine"] = "riscv128"
    path.write_text(json.dumps(manifest))
    with pytest.raises(EngineError, match="recompile"):
        load_engine_set(copy)


def test_unparseable_engine_named_when_manifest_matches_it(copy: Path) -> None:
    """Even a file that matches a (forged) manifest but is not ONNX is reported by name."""
    vocoder = copy / "vocoder.onnx"
    vocoder.write_bytes(b"not an onnx graph")
    manifest = load_manifest(copy)
    manifest.files["vocoder.onnx"] = file_entry(vocoder)
    write_manifest(copy, manifest)
    with pytest.raises(EngineError, match=r"vocoder\.onnx") as caught:
        load_engine_set(copy)
    # what clients may see: the file's name and a short reason, no path, no runtime message
    assert caught.value.public() == "vocoder.onnx: ONNX Runtime could not load it"


def test_int8_vocoder_replaced_in_place_reports_int8(copy: Path, tmp_path: Path) -> None:
    """A file replaced in place: the manifest says fp32, the loaded graph says int8."""
    int8_vocoder(tmp_path / "int8.onnx")
    shutil.copyfile(tmp_path / "int8.onnx", copy / "vocoder.onnx")
    spec = snapshot(EngineCache(tmp_path / "cache"), copy, "v")
    assert spec.replaced == ("vocoder.onnx",)
    engines = load_engine_spec(spec)
    assert load_manifest(copy).precision["vocoder"] == "fp32"
    assert engines.precision == {"acoustic": "fp32", "flow": "fp32", "vocoder": "int8",
                                 "flow_plain": "fp32", "vocoder_plain": "fp32"}  # fmt: skip


def test_engines_compiled_before_durations_serve_audio_but_refuse_timestamps(
    default_version: EngineVersion, tmp_path: Path
) -> None:
    """An engine version without the ``durations`` output (compiled before it was one) loads
    and speaks as before; a stream that asks for word timestamps fails before any audio with a
    409 on ``voice`` that says to recompile."""
    old = load_engine_set(without_durations(default_version.path, tmp_path / "1"))
    assert not old.manifest.durations
    run = old.acoustic.run(np.asarray([[1, 0, 20, 0, 2]]), np.asarray([0.0, 1.0, 0.0], np.float32))
    assert run.durations is None and run.latents.shape[2] > 0
    synth = Synthesizer(old)
    assert sum(len(c.samples) for c in synth.stream("Red, green.")) > 0
    with pytest.raises(TimestampsUnavailable) as caught:
        next(synth.stream("Red, green.", SynthesisParams(timestamps=True)))
    assert (caught.value.status, caught.value.field) == (409, "voice")
    assert "recompile" in caught.value.message
    new = load_engine_set(default_version.path)
    assert new.manifest.durations
    ids, scales = np.asarray([[1, 0, 20, 0, 2]]), np.asarray([0.0, 1.0, 0.0], np.float32)
    assert new.acoustic.run(ids, scales).durations is not None


def test_the_shared_arena_shrinks_by_a_run_of_its_own(default_version: EngineVersion) -> None:
    assert not _CpuArena().shrink()  # no session ever drew from it: nothing to ask
    synth = Synthesizer(load_engine_set(default_version.path))
    audio = synth.synthesize("Before the shrink.", SynthesisParams(noise_scale=0.0, noise_w=0.0))
    assert CPU_ARENA.shrink()
    again = synth.synthesize("Before the shrink.", SynthesisParams(noise_scale=0.0, noise_w=0.0))
    assert np.array_equal(audio, again)  # the sessions run on from a shrunk arena


def test_a_prepared_arena_shrinks_without_building_anything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker prepares the shrink at start: its first idle shrink then runs the prepared
    session only. Built there instead, it imported ``onnx`` on the worker's main thread, which
    took over 10 s on a busy machine: no heartbeats, and the gateway killed the worker."""
    arena = CPU_ARENA  # the process's one arena: registering another would register twice
    arena.register()
    arena.prepare()

    def no_session(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the idle shrink built a session")

    monkeypatch.setattr(ort, "InferenceSession", no_session)
    assert arena.shrink()
