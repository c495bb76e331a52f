"""Comparing a file with its manifest entry: short reasons, no parsing, no hashing of a file
whose size already says it differs."""

from __future__ import annotations

from pathlib import Path

import pytest

from ttsvc.errors import EngineError, EngineIntegrityError
from ttsvc.repository import manifest
from ttsvc.repository.manifest import (
    SHA_MISMATCH,
    file_entry,
    file_problem,
    load_manifest,
    open_checked,
)


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


def _cache_file(tmp_path: Path, content: bytes) -> tuple[Path, str]:
    """A file of the engine cache: content-addressed, written once."""
    path = tmp_path / "blob"
    path.write_bytes(content)
    return path, file_entry(path).sha256


def test_a_cache_file_is_hashed_once_per_process_while_it_stays_the_same_file(
    tmp_path: Path,
) -> None:
    path, sha = _cache_file(tmp_path, b"w" * 4096)
    open_checked(path, sha, immutable=True).close()
    st = path.stat()
    identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    assert manifest._verified[identity] == sha  # the next open of this very file skips the hash
    with open_checked(path, sha, immutable=True) as again:
        assert again.read() == b"w" * 4096


def test_a_cache_file_rewritten_in_place_is_hashed_again_and_refused(tmp_path: Path) -> None:
    path, sha = _cache_file(tmp_path, b"a" * 4096)
    open_checked(path, sha, immutable=True).close()
    with path.open("r+b") as fh:  # same inode, same size, other bytes: a new ctime
        fh.write(b"b" * 4096)
    with pytest.raises(EngineIntegrityError) as err:
        open_checked(path, sha, immutable=True)
    assert err.value.reason == SHA_MISMATCH


def test_a_cache_file_renamed_over_is_hashed_again_and_refused(tmp_path: Path) -> None:
    path, sha = _cache_file(tmp_path, b"c" * 4096)
    open_checked(path, sha, immutable=True).close()
    other = tmp_path / "other"
    other.write_bytes(b"d" * 4096)
    other.replace(path)  # a new inode under the old name
    with pytest.raises(EngineIntegrityError):
        open_checked(path, sha, immutable=True)
