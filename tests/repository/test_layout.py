"""Engine repository layout: complete versions only, highest serves, atomic publish."""

from __future__ import annotations

from pathlib import Path

import pytest

from ttsvc.errors import InvalidParameter
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


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("voice", ["../../rel/pwned-voice", "a/b", ".hidden", "..", "a..b"])
def test_a_write_refuses_what_is_not_a_voice_name(tmp_path: Path, voice: str) -> None:
    """The last guard, whichever caller forgot its own check: before, ``../../rel/x`` made
    ``<root>/../../rel/x`` and published there."""
    root = tmp_path / "a" / "engines"
    root.mkdir(parents=True)
    repo = EngineRepository(root)
    for write in (repo.next_version, repo.staging_dir):
        with pytest.raises(InvalidParameter, match="is not a voice name"):
            write(voice)
    staging = repo.staging_dir("good")
    with pytest.raises(InvalidParameter, match="is not a voice name"):
        repo.publish(voice, staging, 1)
    assert _tree(tmp_path) == ["a", "a/engines", "a/engines/good"]  # the staging removed


def test_a_write_refuses_a_voice_directory_that_leads_out(tmp_path: Path) -> None:
    """A voice name, but its directory a link out of the root: nothing written through it."""
    root, outside = tmp_path / "engines", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "linked").symlink_to(outside, target_is_directory=True)
    repo = EngineRepository(root)
    with pytest.raises(InvalidParameter, match="outside the engines directory"):
        repo.staging_dir("linked")
    staging = repo.staging_dir("good")
    with pytest.raises(InvalidParameter, match="outside the engines directory"):
        repo.publish("linked", staging, 1)
    assert list(outside.iterdir()) == [] and not staging.exists()
    inside = root / "good"
    (root / "alias").symlink_to(inside, target_is_directory=True)  # a link within is fine
    assert repo.publish("alias", repo.staging_dir("alias"), 1).path == root / "alias" / "1"
