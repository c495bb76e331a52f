"""Where engine versions live and how a new one is published atomically.

Layout: ``<root>/<voice>/<version>/`` with numeric versions. A version counts only once its
manifest exists (it is written last); staging directories start with a dot and are never listed.
Publishing is one ``rename`` within the voice directory, so a watcher or loader sees either
nothing or the complete version, never a half-written one; ``copy_version`` publishes a version
made elsewhere (another repository: the image's engines, an operator's build) the same way, and
several writers sharing one volume may run it at once. Whatever names a voice or a file (an
argument, a catalogue entry, a copied manifest), nothing is written outside the root: a write
needs a voice name (``ttsvc.voice.NAME_RE``) whose directory resolves inside the root, and a
copied file a plain name (reads list what is there, links out included, for ``trust.py`` to
judge).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ttsvc.errors import EngineError, EngineIntegrityError, InvalidParameter
from ttsvc.repository.manifest import (
    MANIFEST_NAME,
    Manifest,
    load_manifest,
    open_checked,
    open_verified,
    write_manifest,
)
from ttsvc.voice import name_problem

STAGING_PREFIX = ".staging-"


@dataclass(frozen=True)
class EngineVersion:
    """One published version of a voice's engines."""

    voice: str
    version: int
    path: Path


class EngineRepository:
    """Read and publish engine versions under one root directory (a HostPath in Kubernetes)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def voices(self) -> list[str]:
        """Voices with at least one complete version, sorted."""
        if not self.root.is_dir():
            return []
        return sorted(
            p.name
            for p in self.root.iterdir()
            if p.is_dir() and not p.name.startswith(".") and self.versions(p.name)
        )

    def _inside(self, path: Path) -> bool:
        """Whether ``path`` resolves (symlinks followed) to somewhere below the root."""
        root = self.root.resolve()
        resolved = path.resolve()
        return resolved != root and resolved.is_relative_to(root)

    def voice_dir(self, voice: str) -> Path:
        """The directory a version of ``voice`` is written to; refused (``InvalidParameter``)
        unless ``voice`` is a voice name and the directory resolves inside the root: the last
        guard before a write, whichever caller skipped its own check."""
        problem = name_problem(voice)
        if problem is not None:
            raise InvalidParameter(problem, field="voice")
        vdir = self.root / voice
        if not self._inside(vdir):
            raise InvalidParameter(
                f"{vdir} resolves to {vdir.resolve()}, outside the engines directory "
                f"{self.root.resolve()}: refused",
                field="voice",
            )
        return vdir

    def versions(self, voice: str) -> list[EngineVersion]:
        """Complete versions of ``voice``, oldest first."""
        vdir = self.root / voice
        if not vdir.is_dir():
            return []
        found = [
            EngineVersion(voice, int(p.name), p)
            for p in vdir.iterdir()
            if p.name.isdigit() and (p / MANIFEST_NAME).is_file()
        ]
        return sorted(found, key=lambda v: v.version)

    def latest(self, voice: str) -> EngineVersion | None:
        """The highest complete version: the one that serves."""
        versions = self.versions(voice)
        return versions[-1] if versions else None

    def next_version(self, voice: str) -> int:
        """One above every numeric directory, complete or not, so a publish never collides."""
        vdir = self.voice_dir(voice)
        taken = [int(p.name) for p in vdir.iterdir() if p.name.isdigit()] if vdir.is_dir() else []
        return max(taken, default=0) + 1

    def staging_dir(self, voice: str) -> Path:
        """A fresh directory beside the versions (same filesystem, so the publish is a rename)."""
        vdir = self.voice_dir(voice)
        vdir.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=vdir))

    def publish(self, voice: str, staging: Path, version: int) -> EngineVersion:
        """Rename a finished staging directory into place as ``version``."""
        try:
            target = self.voice_dir(voice) / str(version)
        except InvalidParameter:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        staging.chmod(0o755)  # mkdtemp makes it private; workers may run as another user
        try:
            staging.rename(target)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return EngineVersion(voice, version, target)

    def copy_version(self, source: Path) -> EngineVersion | None:
        """Publish a copy of the version directory ``source`` (of another repository) as the
        next version of the voice its manifest names, or ``None`` where a version with the
        same files (names and sha256) is already here: seeding a volume from the image, once
        per pod start, publishes once, and never stacks an older copy over a newer version.
        The voice is the manifest's, not the folder's: a version directory uploaded as
        ``upload/v1`` is still the voice it was compiled for.

        Each file name the manifest lists must be a plain name (no directory part, not hidden,
        not the manifest itself), checked before anything is staged: the manifest comes from
        elsewhere, and ``../../x`` or an absolute name would write outside the engines
        directory. Each file is read through a handle checked against the manifest, written
        to the staging directory, flushed to disk and hashed again there (a copy that went
        wrong on the way publishes nothing); the manifest (renumbered) is written last, then
        one rename. Writers racing on a shared volume: the loser's rename meets the winner's
        version and it looks again, so each content is published once."""
        manifest = load_manifest(source)
        for name in manifest.files:
            _check_file_name(source, name)
        voice = manifest.voice
        for _ in range(_COPY_RACES):
            if self._has_files(voice, manifest):
                return None
            version = self.next_version(voice)
            staging = self.staging_dir(voice)
            try:
                for name, entry in manifest.files.items():
                    with open_verified(source, manifest, name) as src, \
                            (staging / name).open("wb") as dst:  # fmt: skip
                        shutil.copyfileobj(src, dst)
                        dst.flush()
                        os.fsync(dst.fileno())
                    open_checked(staging / name, entry.sha256, entry.size).close()
                copied = manifest.model_copy(update={"version": version})
                _fsync(write_manifest(staging, copied))
                _fsync(staging)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            try:
                return self.publish(voice, staging, version)
            except OSError:
                if not (self.voice_dir(voice) / str(version)).is_dir():
                    raise  # not a race: the volume refused the rename
        raise OSError(f"{voice}: another writer took each version number {_COPY_RACES} times")

    def _has_files(self, voice: str, manifest: Manifest) -> bool:
        """Whether a complete version of ``voice`` holds exactly ``manifest``'s files."""
        wanted = {n: (e.sha256, e.size) for n, e in manifest.files.items()}
        for v in self.versions(voice):
            try:
                have = load_manifest(v.path).files
            except EngineError:  # a version whose manifest does not parse is not the same
                continue
            if {n: (e.sha256, e.size) for n, e in have.items()} == wanted:
                return True
        return False


def _check_file_name(source: Path, name: str) -> None:
    """Refuse a manifest's file name that is not a plain file name of a version directory."""
    if Path(name).name != name or name.startswith(".") or name == MANIFEST_NAME:
        raise EngineIntegrityError(
            f"{source / MANIFEST_NAME}: lists the file name {name!r}, not a plain file name "
            "of a version directory: nothing copied",
            file=MANIFEST_NAME, reason="lists a file name that is not a plain name",
        )  # fmt: skip


def _fsync(path: Path) -> None:
    """Flush ``path`` (a file or a directory) to disk, so the rename publishes what is there."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_COPY_RACES = 8
"""Rename attempts before a copy gives up: each lost race means another writer published."""
