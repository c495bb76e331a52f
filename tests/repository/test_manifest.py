"""Comparing a file with its manifest entry: short reasons, no parsing, no hashing of a file
whose size already says it differs."""

from __future__ import annotations

from pathlib import Path

import pytest

from ttsvc.errors import EngineError
from ttsvc.repository.manifest import SHA_MISMATCH, file_entry, file_problem, load_manifest


def test_matching_file_has_no_problem(tmp_path: Path) -> None:
    path = tmp_path / "acoustic.onnx"
    path.write_bytes(b"x" * 1000)
    assert file_problem(path, file_entry(path)) is None


def test_truncated_file_is_told_by_its_size_without_hashing(tmp_path: Path) -> None:
    path = tmp_path / "acoustic.onnx"
    path.write_bytes(b"x" * 1000)
    entry = file_entry(path)
    path.write_bytes(b"x" * 400)
    hashed: list[Path] = []

    def sha(p: Path) -> str:
        hashed.append(p)
        return ""

    assert file_problem(path, entry, sha) == "size 400 bytes, the manifest says 1000"
    assert hashed == []  # a copy still growing is not read


def test_same_size_other_bytes_and_missing(tmp_path: Path) -> None:
    path = tmp_path / "vocoder.onnx"
    path.write_bytes(b"x" * 1000)
    entry = file_entry(path)
    path.write_bytes(b"y" * 1000)
    assert file_problem(path, entry) == SHA_MISMATCH
    path.unlink()
    assert file_problem(path, entry) == "missing"
    assert str(tmp_path) not in SHA_MISMATCH


def test_a_manifest_that_cannot_be_read_is_an_engine_error_of_its_version(tmp_path: Path) -> None:
    """An OS error (here: a directory where the file should be; in a pod, permissions or a stale
    NFS handle) refuses that version like a bad manifest, instead of escaping start-up."""
    (tmp_path / "manifest.json").mkdir()
    with pytest.raises(EngineError) as caught:
        load_manifest(tmp_path)
    assert caught.value.public() == "manifest.json: cannot be read"
