"""Engine repository layout: complete versions only, highest serves, atomic publish, and
copies of versions made elsewhere (the chart seeding a volume from the image)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import BinaryIO

import pytest

from ttsvc.errors import EngineIntegrityError, InvalidParameter
from ttsvc.repository import layout
from ttsvc.repository.layout import EngineRepository, EngineVersion
from ttsvc.repository.manifest import file_entry, load_manifest, sha256_file, write_manifest


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


@pytest.fixture
def image(default_version: EngineVersion, tmp_path: Path) -> Path:
    """An engine repository as the cpu image holds it: the default voice's version 1."""
    root = tmp_path / "image"
    shutil.copytree(default_version.path, root / default_version.voice / "1")
    return root


def test_copy_publishes_a_checked_copy_once(image: Path, tmp_path: Path) -> None:
    """Seeding a volume at every pod start: the first copy publishes, the next ones find the
    same files and publish nothing (a restarted pod, a second replica on a shared volume)."""
    (voice,) = EngineRepository(image).voices()
    source = image / voice / "1"
    volume = EngineRepository(tmp_path / "volume")
    published = volume.copy_version(source)
    assert published is not None and published.path == volume.root / voice / "1"
    for name, entry in load_manifest(source).files.items():
        assert sha256_file(published.path / name) == entry.sha256
    assert load_manifest(published.path).version == 1
    assert volume.copy_version(source) is None
    assert [v.version for v in volume.versions(voice)] == [1]
    assert [p.name for p in (volume.root / voice).iterdir()] == ["1"]  # no staging left


def test_copy_never_stacks_an_old_copy_over_a_newer_version(image: Path, tmp_path: Path) -> None:
    """An operator published version 2; the pod's next start seeds the image's version again:
    it is there (as 1), so 2 keeps serving."""
    (voice,) = EngineRepository(image).voices()
    volume = EngineRepository(tmp_path / "volume")
    volume.copy_version(image / voice / "1")
    newer = volume.copy_version(_altered(image / voice / "1", tmp_path / "build" / voice / "1"))
    assert newer is not None and newer.version == 2
    assert volume.copy_version(image / voice / "1") is None
    latest = volume.latest(voice)
    assert latest is not None and latest.version == 2


def test_copy_of_a_torn_source_publishes_nothing(image: Path, tmp_path: Path) -> None:
    (voice,) = EngineRepository(image).voices()
    source = image / voice / "1"
    name, entry = next(iter(load_manifest(source).files.items()))
    with (source / name).open("r+b") as fh:  # a copy still in progress: short by one byte
        fh.truncate(entry.size - 1)
    volume = EngineRepository(tmp_path / "volume")
    with pytest.raises(EngineIntegrityError, match=name):
        volume.copy_version(source)
    assert volume.versions(voice) == [] and list((volume.root / voice).iterdir()) == []


def test_writers_racing_on_a_shared_volume_publish_each_content_once(
    image: Path, tmp_path: Path
) -> None:
    """Two pods seed one shared volume at once: the other writer's rename lands between this
    one's numbering and its own rename (scripted here, in process), so this rename meets a
    version directory; it looks again and finds the same files."""
    (voice,) = EngineRepository(image).voices()
    source = image / voice / "1"
    root = tmp_path / "volume"

    class LosesTheRace(EngineRepository):
        def publish(self, voice: str, staging: Path, version: int) -> EngineVersion:
            assert EngineRepository(root).copy_version(source) is not None  # the other pod
            return super().publish(voice, staging, version)

    assert LosesTheRace(root).copy_version(source) is None
    assert [v.version for v in EngineRepository(root).versions(voice)] == [1]
    assert [p.name for p in (root / voice).iterdir()] == ["1"]


def _altered(source: Path, target: Path) -> Path:
    """A version directory like ``source`` whose voice.json (listed in its manifest) differs."""
    shutil.copytree(source, target)
    manifest = load_manifest(target)
    config = target / "voice.json"
    config.write_text(config.read_text() + "\n")
    manifest.files["voice.json"] = file_entry(config)
    write_manifest(target, manifest)
    return target


@pytest.mark.parametrize(
    "name", ["../../../escaped", "ABSOLUTE", "sub/voice.json", ".hidden", "manifest.json"]
)
def test_copy_refuses_a_manifest_file_name_that_is_not_a_plain_name(
    image: Path, tmp_path: Path, name: str
) -> None:
    """The source's manifest comes from elsewhere: a listed name with a directory part or an
    absolute one would be read and written outside the version directories (``../../../x``
    from the staging directory is beside the engines directory). Refused before staging, even
    where the file it names exists and matches."""
    (voice,) = EngineRepository(image).voices()
    source = tmp_path / "build" / voice / "1"
    shutil.copytree(image / voice / "1", source)
    if name == "ABSOLUTE":
        name = str(tmp_path / "absolute")
    target = source / name  # what the unchecked copy would read
    target.parent.mkdir(parents=True, exist_ok=True)
    if name != "manifest.json":
        target.write_bytes(b"not an engine")
    manifest = load_manifest(source)
    manifest.files[name] = file_entry(target) if name != "manifest.json" else file_entry(
        source / "voice.json"
    )
    write_manifest(source, manifest)
    volume = EngineRepository(tmp_path / "a" / "b" / "volume")
    with pytest.raises(EngineIntegrityError, match="not a plain file name"):
        volume.copy_version(source)
    assert not (volume.root / voice).exists()  # refused before a staging directory
    assert not (volume.root.parent / "escaped").exists()


def test_copy_publishes_under_the_manifests_voice_not_the_folders(
    image: Path, tmp_path: Path
) -> None:
    """A single version directory uploaded as ``upload/v1``: the voice is the one its
    manifest names, not ``upload``."""
    (voice,) = EngineRepository(image).voices()
    upload = tmp_path / "upload" / "v1"
    shutil.copytree(image / voice / "1", upload)
    volume = EngineRepository(tmp_path / "volume")
    published = volume.copy_version(upload)
    assert published is not None and published.voice == voice
    assert published.path == volume.root / voice / "1"
    assert volume.voices() == [voice]
    assert volume.copy_version(upload) is None  # and it is that voice's version found again


def test_copy_hashes_the_staged_copy_again(
    image: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault injected on the way (a copy that flips a byte): the source handle's bytes were
    right, the staged file is not; it is refused and nothing is published."""
    (voice,) = EngineRepository(image).voices()

    def flipping_copy(src: BinaryIO, dst: BinaryIO) -> None:
        data = bytearray(src.read())
        data[0] ^= 0xFF
        dst.write(bytes(data))

    monkeypatch.setattr(layout.shutil, "copyfileobj", flipping_copy)
    volume = EngineRepository(tmp_path / "volume")
    with pytest.raises(EngineIntegrityError, match="does not match"):
        volume.copy_version(image / voice / "1")
    assert volume.versions(voice) == [] and list((volume.root / voice).iterdir()) == []
