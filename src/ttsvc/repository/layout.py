"""Where engine versions live and how a new one is published atomically.

Layout: ``<root>/<voice>/<version>/`` with numeric versions. A version counts only once its
manifest exists (it is written last); staging directories start with a dot and are never listed.
Publishing is one ``rename`` within the voice directory, so a watcher or loader sees either
nothing or the complete version, never a half-written one.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ttsvc.repository.manifest import MANIFEST_NAME

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
        vdir = self.root / voice
        taken = [int(p.name) for p in vdir.iterdir() if p.name.isdigit()] if vdir.is_dir() else []
        return max(taken, default=0) + 1

    def staging_dir(self, voice: str) -> Path:
        """A fresh directory beside the versions (same filesystem, so the publish is a rename)."""
        vdir = self.root / voice
        vdir.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=vdir))

    def publish(self, voice: str, staging: Path, version: int) -> EngineVersion:
        """Rename a finished staging directory into place as ``version``."""
        target = self.root / voice / str(version)
        staging.chmod(0o755)  # mkdtemp makes it private; workers may run as another user
        try:
            staging.rename(target)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return EngineVersion(voice, version, target)
