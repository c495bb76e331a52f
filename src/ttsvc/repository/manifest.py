"""``manifest.json``: what an engine version holds and how to tell it is complete and intact.

The manifest is written last, so its presence marks a finished version; its sizes and sha256 let
a loader refuse a truncated or altered file *before* the runtime parses untrusted bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ttsvc.errors import EngineError, EngineIntegrityError

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1
_CHUNK = 1 << 20


class FileEntry(BaseModel):
    """One file of an engine version."""

    size: int
    sha256: str


class FrameContext(BaseModel):
    """Latent frames of context each side of a window so windowed output equals one-shot output.

    Measured by ``ttsvc compile`` on the frame engine itself, not assumed from the architecture.
    """

    left: int = Field(ge=0)
    right: int = Field(ge=0)
    max_abs_error: float
    """Largest sample difference, windowed vs one-shot, measured at these contexts."""


class Manifest(BaseModel):
    """The contract between ``ttsvc compile`` and the runtime that loads an engine set."""

    model_config = ConfigDict(extra="ignore")

    format_version: int = FORMAT_VERSION
    voice: str
    version: int
    backend: Literal["ort", "trt"]
    precision: dict[str, str]
    """Per engine (``acoustic``, ``vocoder``): fp32, fp16 or int8, as actually kept."""
    sample_rate: int
    hop_length: int
    latent_channels: int
    split_at: str
    num_speakers: int = Field(1, ge=1)
    """Speakers the engines take (their ``sid`` input); 1 for a single-speaker voice."""
    speakers: dict[str, int] = Field(default_factory=dict)
    """Speaker names to ids, from the voice's ``speaker_id_map`` (empty: ids only)."""
    contexts: dict[str, FrameContext]
    """Per windowed engine (``flow`` when there is one, ``vocoder``): its measured context; for
    stateful engines, 0 left and the frames a first window reads past its end (the lag)."""
    streaming: Literal["context", "stateful"] = "context"
    """Which kind of frame engines the version holds: windows with recomputed context, or
    stateful engines (``compile/stateful.py``). A worker serves both; versions compiled before
    the choice existed are context engines."""
    files: dict[str, FileEntry]
    runtime: dict[str, str]
    """Fingerprint of what the engines were built for (runtime versions, CPU or GPU)."""
    source: dict[str, str]
    """The checkpoint the engines came from (name and sha256)."""
    quality: dict[str, float] = Field(default_factory=dict)
    """Quality checks run at compile time, e.g. SNR in dB of a quantized engine against fp32."""
    max_batch: int = Field(1, ge=1)
    """Most stream windows one frame-engine call may carry (TensorRT plans; 1 on CPU)."""
    profiles: dict[str, dict[str, list[list[int]]]] = Field(default_factory=dict)
    """TensorRT plans only: per engine, per input, its ``[min, opt, max]`` shape."""
    layout: dict[str, str] = Field(default_factory=dict)
    """ONNX Runtime engines only: per engine, ``conv2d`` when its 1-D convolutions were lifted
    to 2-D ones (a faster kernel path; ``compile/layout.py``), else ``conv1d``."""
    durations: bool = False
    """The acoustic engine also outputs each phoneme id's frame count (``durations``), which
    word timestamps are made of. False for engines compiled before it did: they serve audio
    without timestamps."""
    speed_durations: bool = False
    """Above speed 1 the acoustic engine divides the voice's speed-1 frame counts by the speed
    (``compile/speed.py``), so speech length follows 1/speed up to 4; at speed 1 and below its
    output is Piper's. False for engines compiled before: every phoneme id keeps at least one
    frame there, and speech barely shortens above speed ~2."""
    created_at: str


def sha256_file(path: Path) -> str:
    """Hash a file in chunks so large engines do not need to fit in memory twice."""
    with path.open("rb") as fh:
        return _digest(fh)[0]


def _digest(handle: BinaryIO) -> tuple[str, int]:
    """sha256 hex and byte count of what is left in ``handle``, read in chunks."""
    digest = hashlib.sha256()
    count = 0
    while block := handle.read(_CHUNK):
        digest.update(block)
        count += len(block)
    return digest.hexdigest(), count


def file_entry(path: Path) -> FileEntry:
    """Size and checksum of one file, as the manifest records it."""
    return FileEntry(size=path.stat().st_size, sha256=sha256_file(path))


def cpu_fingerprint() -> dict[str, str]:
    """The CPU features an ONNX Runtime graph optimization may have specialised for."""
    flags = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("flags"):
                wanted = ("avx", "avx2", "avx512f", "avx512_vnni", "avx_vnni", "fma", "f16c", "amx")
                have = set(line.split(":", 1)[1].split())
                flags = ",".join(f for f in wanted if f in have)
                break
    return {"machine": platform.machine(), "cpu_flags": flags, "cpu_count": str(os.cpu_count())}


def write_manifest(directory: Path, manifest: Manifest) -> Path:
    """Write the manifest through a temporary file and a rename, so readers never see half of it."""
    target = directory / MANIFEST_NAME
    tmp = directory / f".{MANIFEST_NAME}.tmp"
    tmp.write_text(manifest.model_dump_json(indent=2) + "\n", encoding="utf-8")
    tmp.replace(target)
    return target


def load_manifest(directory: Path) -> Manifest:
    """Read and validate a version's manifest; an unreadable one is an engine error naming it."""
    path = directory / MANIFEST_NAME
    try:
        return Manifest.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError as exc:
        raise EngineError(f"{path}: no manifest (incomplete engine version)",
                          file=MANIFEST_NAME, reason="missing") from exc  # fmt: skip
    except (json.JSONDecodeError, ValidationError, UnicodeDecodeError) as exc:
        raise EngineError(f"{path}: unreadable manifest: {exc}", file=MANIFEST_NAME,
                          reason="not a valid manifest") from exc  # fmt: skip
    except OSError as exc:  # permissions, EIO, a stale NFS handle: this version, not start-up
        raise EngineError(f"{path}: cannot be read: {exc}", file=MANIFEST_NAME,
                          reason="cannot be read") from exc  # fmt: skip


def open_verified(directory: Path, manifest: Manifest, name: str) -> BinaryIO:
    """Open one listed file checked against the manifest; parse from the handle returned."""
    entry = manifest.files.get(name)
    path = directory / name
    if entry is None:
        raise EngineIntegrityError(f"{path}: not listed in {MANIFEST_NAME}", file=name,
                                   reason=f"not listed in {MANIFEST_NAME}")  # fmt: skip
    return open_checked(path, entry.sha256, entry.size)


FileIdentity = tuple[int, int, int, int, int]
"""(device, inode, size, mtime_ns, ctime_ns): what changes whenever a file's bytes may have."""
_verified: dict[FileIdentity, str] = {}
"""Files of the engine cache this process already hashed, by identity (``open_checked``)."""


def open_checked(
    path: Path, sha256: str, size: int | None = None, *, immutable: bool = False
) -> BinaryIO:
    """Open a file, check its size (when known) and sha256 through that handle, and return the
    handle at offset 0, naming the file on a mismatch.

    Whatever is parsed from the handle is the content that was hashed: a rename over the path
    afterwards does not reach a file already open. Parsing from the handle (its ``/proc/self/fd``
    path) instead of from a bytes copy keeps one less copy of every engine in a worker's memory.

    ``immutable``: a file of the gateway's engine cache, written once through a temporary name
    and a rename and never rewritten. A process hashes such a file once: opened again with the
    same device, inode, size, mtime and ctime (a rename over it gives a new inode, any write a
    new ctime, which no one can set back), it is the same bytes, and a worker reloading a voice
    it let go of under its memory budget does not hash sixty megabytes again while a request
    waits.
    """
    try:
        handle = path.open("rb")
    except FileNotFoundError as exc:
        raise EngineIntegrityError(f"{path}: missing", file=path.name, reason="missing") from exc
    try:
        st = os.fstat(handle.fileno())
        actual = st.st_size
        if size is not None and actual != size:  # free, and catches a copy still in progress
            raise EngineIntegrityError(
                f"{path}: size {actual} bytes, manifest says {size} (truncated or replaced)",
                file=path.name, reason=size_mismatch(actual, size),
            )  # fmt: skip
        identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if not (immutable and _verified.get(identity) == sha256):
            digest, count = _digest(handle)
            if digest != sha256 or (size is not None and count != size):
                raise EngineIntegrityError(
                    f"{path}: sha256 {digest[:12]}… does not match the expected {sha256[:12]}…",
                    file=path.name, reason=SHA_MISMATCH,
                )  # fmt: skip
            if immutable:
                _verified[identity] = digest
        handle.seek(0)
    except BaseException:
        handle.close()
        raise
    return handle


SHA_MISMATCH = "sha256 does not match the manifest"


def size_mismatch(actual: int, expected: int) -> str:
    """The short reason for a file of the wrong size (truncated, or still being copied)."""
    return f"size {actual} bytes, the manifest says {expected}"


def file_problem(
    path: Path, entry: FileEntry, sha256: Callable[[Path], str] = sha256_file
) -> str | None:
    """Why ``path`` does not match its manifest entry, as a short reason naming nothing of the
    host, or ``None`` when it matches. Reads, never parses; the size is compared first, so a
    file still growing is not hashed. ``sha256`` may remember digests of unchanged files."""
    try:
        size = path.stat().st_size
        if size != entry.size:
            return size_mismatch(size, entry.size)
        digest = sha256(path)
    except FileNotFoundError:
        return "missing"
    except OSError as exc:  # unreadable is not a reason to stop watching the others
        return f"unreadable ({exc.strerror})"
    return None if digest == entry.sha256 else SHA_MISMATCH


def verify_files(directory: Path, manifest: Manifest) -> None:
    """Check every listed file's size and sha256 without parsing any of them."""
    for name in manifest.files:
        open_verified(directory, manifest, name).close()
