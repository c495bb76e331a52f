"""Content-addressed copies of engine files in writable scratch, the only place workers load from.

Why a copy: the engines directory is a HostPath that operators change in place. A worker that
respawns while a file there is half-copied must still start on the last good engine, and a file
that changes between its check and its load must not be loaded. So the gateway copies each
candidate file once into ``<cache>/<sha256>`` (hashing while copying, writing through a temporary
name), and workers read only those immutable copies, checking the hash again as they load (once
per process and file: ``manifest.open_checked``). Copying and hashing are not parsing: untrusted
bytes are parsed only inside workers. The gateway keeps a directory per voice, so a swap prunes
only its own voice's files.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from ttsvc.errors import EngineIntegrityError
from ttsvc.protocol import EngineSpec
from ttsvc.repository.manifest import load_manifest

_CHUNK = 1 << 20


class EngineCache:
    """A directory of engine files named by their sha256; lives in the gateway process."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def admit(self, source: Path) -> str:
        """Copy ``source`` in, return its sha256. The copy is complete or absent, never partial."""
        digest = hashlib.sha256()
        fd, tmp_name = tempfile.mkstemp(prefix=".admit-", dir=self.root)
        tmp = Path(tmp_name)
        try:
            with source.open("rb") as src, os.fdopen(fd, "wb") as dst:
                while block := src.read(_CHUNK):
                    digest.update(block)
                    dst.write(block)
            sha = digest.hexdigest()
            tmp.replace(self.root / sha)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return sha

    def prune(self, keep: set[str]) -> None:
        """Delete cached files no spec in ``keep`` uses (bounded disk over repeated swaps)."""
        for path in self.root.iterdir():
            if path.name not in keep and not path.name.startswith(".admit-"):
                path.unlink(missing_ok=True)


def file_state(path: Path) -> tuple[int, int, int] | None:
    """(size, mtime_ns, inode) of a file, or None while it is missing: what says it changed."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino


def snapshot(cache: EngineCache, directory: Path, voice: str) -> EngineSpec:
    """Admit every file a version's manifest lists and describe the result for workers.

    A file whose hash differs from its manifest entry (replaced in place, the operators' habit)
    is admitted as is: the staging worker's canary decides whether it may serve. The label then
    carries a content hash, so responses show which bytes produced them.
    """
    manifest = load_manifest(directory)
    files: dict[str, str] = {}
    for name in manifest.files:
        before = file_state(directory / name)
        if before is None:
            raise EngineIntegrityError(f"{directory / name}: missing", file=name, reason="missing")
        try:
            files[name] = cache.admit(directory / name)
        except FileNotFoundError as exc:  # renamed away between the stat and the open
            raise EngineIntegrityError(f"{directory / name}: missing", file=name,
                                       reason="missing") from exc  # fmt: skip
        if file_state(directory / name) != before:
            raise EngineIntegrityError(f"{directory / name}: changed while it was read",
                                       file=name, reason="changed while it was read")  # fmt: skip
    replaced = sorted(n for n, sha in files.items() if sha != manifest.files[n].sha256)
    label = str(manifest.version)
    if replaced:
        combined = hashlib.sha256("".join(files[n] for n in sorted(files)).encode()).hexdigest()
        label = f"{manifest.version}+{combined[:8]}"
    return EngineSpec(
        label=label,
        voice=voice,
        version=manifest.version,
        source=str(directory),
        files=files,
        replaced=tuple(replaced),
        manifest=manifest.model_dump_json(),
        cache_dir=str(cache.root),
    )
