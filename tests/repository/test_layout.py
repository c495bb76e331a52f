"""Engine repository layout: complete versions only, highest serves, atomic publish."""

from __future__ import annotations

from pathlib import Path

from ttsvc.repository.layout import EngineRepository


def _version(root: Path, voice: str, name: str, complete: bool = True) -> Path:
    path = root / voice / name
    path.mkdir(parents=True)
    if complete:
        (path / "manifest.json").write_text("{}")
    return path


def test_only_complete_numeric_versions_count(tmp_path: Path) -> None:
    _version(tmp_path, "a", "1")
    _version(tmp_path, "a", "3", complete=False)  # still being written
    _version(tmp_path, "a", "2")
    _version(tmp_path, "a", ".staging-x")
    _version(tmp_path, "a", "old")
    repo = EngineRepository(tmp_path)
    assert [v.version for v in repo.versions("a")] == [1, 2]
    latest = repo.latest("a")
    assert latest is not None and latest.version == 2
    assert repo.next_version("a") == 4  # never reuses an incomplete number
    assert repo.voices() == ["a"]


def test_empty_or_missing_root(tmp_path: Path) -> None:
    repo = EngineRepository(tmp_path / "nothing")
    assert repo.voices() == []
    assert repo.latest("a") is None
    assert repo.next_version("a") == 1


def test_publish_is_a_rename(tmp_path: Path) -> None:
    repo = EngineRepository(tmp_path)
    staging = repo.staging_dir("a")
    (staging / "manifest.json").write_text("{}")
    inode = staging.stat().st_ino
    published = repo.publish("a", staging, 1)
    assert published.path == tmp_path / "a" / "1"
    assert published.path.stat().st_ino == inode
    assert not staging.exists()
    assert repo.latest("a") == published
