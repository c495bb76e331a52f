"""An engine version as ``ttsvc compile`` made it before the acoustic engine output durations."""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx

from ttsvc.backends.base import DURATIONS_OUTPUT
from ttsvc.backends.onnxruntime import ACOUSTIC_FILE
from ttsvc.repository.manifest import file_entry, load_manifest, write_manifest


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
