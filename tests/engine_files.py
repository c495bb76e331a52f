"""Engine files for tests: valid variants of a compiled engine, and versions published the way
``ttsvc compile`` publishes them (staging directory, manifest written last, one rename)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

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
