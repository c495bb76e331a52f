"""Engine files for tests: valid variants of a compiled engine, versions published the way
``ttsvc compile`` publishes them (staging directory, manifest written last, one rename), and
files other than what it makes today (a version from before the acoustic engine output
durations, an int8 vocoder as ``--quantize int8`` keeps it)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic

from ttsvc.backends.base import DURATIONS_OUTPUT
from ttsvc.backends.onnxruntime import ACOUSTIC_FILE
from ttsvc.compile.build import default_checkpoint
from ttsvc.compile.inputs import load_piper_graph
from ttsvc.compile.split import split_model
from ttsvc.repository.layout import EngineRepository
from ttsvc.repository.manifest import file_entry, load_manifest, write_manifest

VOICE = "en_US-joe-medium"


def variant(src: Path, dst: Path, factor: float) -> None:
    """A different but valid engine: its largest float weight scaled by ``factor``."""
    model = onnx.load(str(src))
    init = max(
        (i for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT),
        key=lambda i: int(np.prod(i.dims)),
    )
    scaled = numpy_helper.to_array(init) * np.float32(factor)
    init.CopyFrom(numpy_helper.from_array(scaled.astype(np.float32), init.name))
    onnx.save(model, str(dst))


def silent_vocoder(src: Path, dst: Path) -> None:
    """A vocoder that loads and runs but outputs silence: its last convolution (which ONNX
    Runtime fused with the final tanh) has zero weights, so every sample is tanh(0)."""
    model = onnx.load(str(src))
    last_conv = [node for node in model.graph.node if "Conv" in node.op_type][-1]
    weights = {init.name: init for init in model.graph.initializer}
    for name in last_conv.input[1:]:
        init = weights[name]
        zero = np.zeros(numpy_helper.to_array(init).shape, np.float32)
        init.CopyFrom(numpy_helper.from_array(zero, name))
    onnx.save(model, str(dst))


def random_bytes(dst: Path, size: int, seed: int = 7) -> Path:
    """A file of ``size`` random bytes: an engine no runtime can parse, which a manifest written
    for it still matches (a bad publish, not a torn copy)."""
    dst.write_bytes(np.random.default_rng(seed).bytes(size))
    return dst


def publish(engines: Path, replace: dict[str, Path], runtime: dict[str, str] | None = None,
             content: dict[str, Path] | None = None, voice: str = VOICE) -> int:  # fmt: skip
    """Publish a new version of ``voice`` the way `ttsvc compile` does: staging directory,
    manifest, rename. ``content`` puts other bytes under a name than its manifest entry
    describes (a fault)."""
    repo = EngineRepository(engines)
    latest = repo.latest(voice)
    assert latest is not None
    version = repo.next_version(voice)
    staging = repo.staging_dir(voice)
    for item in latest.path.iterdir():
        if item.name != "manifest.json":
            shutil.copyfile(replace.get(item.name, item), staging / item.name)
    manifest = load_manifest(latest.path)
    manifest.version = version
    for name in replace:
        manifest.files[name] = file_entry(staging / name)
    if runtime:
        manifest.runtime.update(runtime)
    for name, path in (content or {}).items():
        shutil.copyfile(path, staging / name)
    write_manifest(staging, manifest)
    repo.publish(voice, staging, version)
    return version


def rewrite(version: Path, replace: dict[str, Path]) -> None:
    """Put other bytes into a published version and make its manifest say them (what a bad
    publish looks like to every check but loading them)."""
    manifest = load_manifest(version)
    for name, source in replace.items():
        shutil.copyfile(source, version / name)
        manifest.files[name] = file_entry(version / name)
    write_manifest(version, manifest)


def without_durations(version: Path, target: Path) -> Path:
    """A copy of the version directory ``version`` at ``target`` whose acoustic engine lacks the
    ``durations`` output and whose manifest says so, with the files' hashes made right."""
    shutil.copytree(version, target)
    path = target / ACOUSTIC_FILE
    model = onnx.load(str(path))
    kept = [out for out in model.graph.output if out.name != DURATIONS_OUTPUT]
    assert len(kept) < len(model.graph.output), "the source version has no durations output"
    del model.graph.output[:]
    model.graph.output.extend(kept)
    nodes = [node for node in model.graph.node if DURATIONS_OUTPUT not in node.output]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, str(path))
    manifest = load_manifest(target)
    manifest.files[ACOUSTIC_FILE] = file_entry(path)
    manifest.durations = False
    write_manifest(target, manifest)
    return target


def int8_vocoder(dst: Path) -> Path:
    """The packaged voice's vocoder with int8 weights, quantized from its split graph as
    ``ttsvc compile --quantize int8`` does (a published vocoder may be in ONNX Runtime's blocked
    layout, ``compile/layout.py``, whose convolutions the quantizer does not know)."""
    fp32 = dst.with_suffix(".fp32.onnx")
    onnx.save(split_model(load_piper_graph(default_checkpoint()[0])).vocoder, str(fp32))
    quantize_dynamic(str(fp32), str(dst), weight_type=QuantType.QInt8)
    fp32.unlink()
    return dst
