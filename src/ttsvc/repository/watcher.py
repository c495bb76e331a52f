"""Candidate detection: which engine versions on disk changed, and do they match their manifests.

Why a module of its own: this part of hot swap only looks at files (watchfiles events, manifests,
file states, sha256) and needs nothing from the gateway or the worker pool, so it belongs with the
engines directory it watches. The gateway's ``EngineSwapper`` (``ttsvc.lifecycle.swapper``) decides
what to do with a version judged here: wait for it to settle, stage it, roll it out, report it.

Nothing here parses an engine file: files are compared with their manifest (size, then sha256),
and a version that does not match is described by a ``Rejection`` that names a file, never a
host path.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

from watchfiles import Change, awatch

from ttsvc.errors import EngineError
from ttsvc.repository.cache import file_state
from ttsvc.repository.layout import STAGING_PREFIX, EngineVersion
from ttsvc.repository.manifest import (
    MANIFEST_NAME,
    Manifest,
    file_problem,
    load_manifest,
    sha256_file,
)
from ttsvc.repository.trust import TrustPolicy

NOISE_SUFFIXES = (".bak", ".swp", ".swx", ".swo", "~", ".tmp", ".part", ".partial", ".crdownload")
"""Names an editor, a copy tool or an operator's backup leaves: never a candidate by themselves."""

FileState = tuple[int, int, int] | None
States = dict[str, FileState]
Digests = dict[tuple[str, FileState], str]


def watch_changes(
    path: Path,
    keep: Callable[[Change, str], bool],
    stop: asyncio.Event,
    polling: bool,
    recursive: bool = True,
) -> AsyncIterator[set[tuple[Change, str]]]:
    """Batches of changes under ``path`` that ``keep`` keeps, until ``stop`` is set: 50 ms
    debounce, so a rename or a copy's writes arrive as one batch, and 50 ms polls where
    ``polling`` (filesystems without inotify)."""
    return awatch(path, watch_filter=keep, debounce=50, step=10, stop_event=stop,
                  force_polling=polling, poll_delay_ms=50, recursive=recursive)  # fmt: skip


def load_manifest_json(text: str) -> Manifest:
    """A spec's manifest (validated JSON, metadata only)."""
    return Manifest.model_validate_json(text)


def relevant(change: Change, path: str) -> bool:
    """watchfiles filter: ignore backups, editor swap files, temp names and staging dirs."""
    name = Path(path).name
    if name.startswith(".") or name.startswith(STAGING_PREFIX):
        return False
    return not name.endswith(NOISE_SUFFIXES)


@dataclass(frozen=True)
class Rejection:
    """Why a version may not serve, as clients may read it: a file name, no host paths."""

    version: int
    file: str | None
    reason: str

    def public(self) -> dict[str, object]:
        """The ``GET /voices`` entry."""
        return {"version": self.version, "file": self.file, "reason": self.reason}

    def line(self) -> str:
        """One line: ``version 2: acoustic.onnx: sha256 does not match the manifest``."""
        where = f"{self.file}: " if self.file else ""
        return f"version {self.version}: {where}{self.reason}"


@dataclass(frozen=True)
class VersionCheck:
    """A version's files compared with its manifest at one moment, without parsing any."""

    version: EngineVersion
    states: States
    """(size, mtime, inode) of the manifest and of every file it lists (None: missing)."""
    problems: dict[str, str]
    """File name → short reason it differs from its manifest entry (``manifest.json`` itself
    when that is missing or unreadable)."""
    untrusted: dict[str, str] = field(default_factory=dict)
    """File name (or ``""`` for the version's directories) → why it may not be trusted
    (``ttsvc.repository.trust``): a version with any is refused, whatever its manifest says."""

    def refusal(self) -> Rejection | None:
        """The rejection an untrusted file or directory makes of this version, if any."""
        for name, reason in self.untrusted.items():
            return Rejection(self.version.version, name or None, reason)
        return None

    @property
    def complete(self) -> bool:
        """The manifest is readable and every file it lists is there."""
        return MANIFEST_NAME not in self.problems and None not in self.states.values()

    def key(self) -> tuple[object, ...]:
        """What identifies these exact files: a judgement holds until one of them changes (or
        what made one untrusted is mended)."""
        return (str(self.version.path), tuple(sorted(self.states.items())),
                tuple(sorted(self.untrusted.items())))  # fmt: skip


def check_version(
    version: EngineVersion, digests: Digests, trust: TrustPolicy | None = None
) -> VersionCheck:
    """Compare a version's files with its manifest, and (``trust``) check that they and its
    directories may be trusted (blocking: run in a thread).

    ``digests`` remembers the sha256 of files by state, so a file that did not change is not
    hashed again on the next look.
    """
    directory = version.path
    untrusted: dict[str, str] = {}
    if trust is not None:
        for label, place in (("voice directory", directory.parent),
                             ("version directory", directory)):  # fmt: skip
            if (why := trust.problem(place)) is not None:
                untrusted.setdefault("", f"{label}: {why}")
        if (why := trust.problem(directory / MANIFEST_NAME)) is not None:
            untrusted[MANIFEST_NAME] = why
    states: States = {MANIFEST_NAME: file_state(directory / MANIFEST_NAME)}
    try:
        manifest = load_manifest(directory)
    except EngineError as exc:
        return VersionCheck(version, states, {MANIFEST_NAME: exc.reason or "unreadable"},
                            untrusted)  # fmt: skip
    problems: dict[str, str] = {}
    for name, entry in manifest.files.items():
        if trust is not None and (why := trust.problem(directory / name)) is not None:
            untrusted[name] = why
        path = directory / name
        state = states[name] = file_state(path)

        def digest(p: Path, key: tuple[str, FileState] = (str(path), state)) -> str:
            if key not in digests:
                digests[key] = sha256_file(p)
            return digests[key]

        if (problem := file_problem(path, entry, digest)) is not None:
            problems[name] = problem
    return VersionCheck(version, states, problems, untrusted)
