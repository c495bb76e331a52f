"""API keys: a file of key hashes (a mounted Kubernetes Secret works), checked per request.

The file holds one key per line, ``name sha256-hex [rpm=N] [audio_s_per_min=X] [streams=N]``;
``#`` starts a comment. Only hashes are at rest: a key is 32 random bytes (``ttsvc keys add``
makes one and prints it once), so a fast hash is enough (a slow, salted hash protects guessable
passwords, and would cost CPU on every request). A presented key is hashed and compared with
every entry in constant time (``hmac.compare_digest``), so timing tells nothing about which entry
came close.
Keys are never logged: the key's ``name`` is what logs and metrics carry.

``KeyStore`` lives on the gateway's event loop; reloading reads the file in a thread. It watches
the file's directory, because Kubernetes updates a mounted Secret by swapping a symlink in it.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import math
import os
import re
import secrets
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from watchfiles import awatch

from ttsvc.errors import Unauthorized
from ttsvc.gateway.core.quotas import Quota
from ttsvc.observability.logs import get_logger

log = get_logger("auth")

KEY_PREFIX = "ttsvc-"
_NAME = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
_HEX = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class ApiKey:
    """One entry of the key file."""

    name: str
    """What logs and metrics show for requests made with this key."""
    digest: bytes
    """sha256 of the key."""
    quota: Quota


class KeyFileError(ValueError):
    """A key file line that does not parse (the message names the file and line)."""


def hash_key(key: str) -> str:
    """The hex digest stored for ``key``."""
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    """A fresh key: 256 random bits, URL-safe, recognizable by its prefix."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_line(name: str, key: str, quota: Quota) -> str:
    """The key file line for ``key`` (its hash, never the key)."""
    if not _NAME.fullmatch(name):
        raise KeyFileError(f"key name {name!r}: use 1-64 of A-Z a-z 0-9 _ . @ -")
    parts = [name, hash_key(key)]
    if quota.requests_per_minute is not None:
        parts.append(f"rpm={quota.requests_per_minute}")
    if quota.audio_s_per_minute is not None:
        parts.append(f"audio_s_per_min={quota.audio_s_per_minute:g}")
    if quota.streams is not None:
        parts.append(f"streams={quota.streams}")
    return " ".join(parts)


def parse_keys(text: str, source: str, default: Quota) -> list[ApiKey]:
    """Entries of a key file; ``default`` fills limits a line does not set."""
    keys: list[ApiKey] = []
    names: set[str] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{number}"
        name, *rest = line.split()
        if not _NAME.fullmatch(name) or not rest or not _HEX.fullmatch(rest[0]):
            raise KeyFileError(f"{where}: expected 'name sha256-hex [rpm=N] [audio_s_per_min=X] "
                               "[streams=N]'")  # fmt: skip
        if name in names:
            raise KeyFileError(f"{where}: key name {name!r} appears twice")
        names.add(name)
        limits: dict[str, float] = {}
        for option in rest[1:]:
            field, _, value = option.partition("=")
            try:
                number_value = float(value)
            except ValueError:
                number_value = -1.0
            whole = field != "audio_s_per_min"  # rpm and streams count whole things
            if (field not in ("rpm", "audio_s_per_min", "streams")
                    or not 0 < number_value < math.inf
                    or (whole and not number_value.is_integer())):  # fmt: skip
                raise KeyFileError(f"{where}: {option!r}: expected rpm=N, audio_s_per_min=X "
                                   "or streams=N, > 0")  # fmt: skip
            limits[field] = number_value
        rpm, streams = limits.get("rpm"), limits.get("streams")
        quota = Quota(
            int(rpm) if rpm is not None else default.requests_per_minute,
            limits.get("audio_s_per_min", default.audio_s_per_minute),
            int(streams) if streams is not None else default.streams,
        )
        keys.append(ApiKey(name, bytes.fromhex(rest[0]), quota))
    return keys


def append_key(path: Path, line: str) -> None:
    """Add a line to a key file by writing a new file and renaming it into place, so a server
    watching the file never reads half of it."""
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    if old and not old.endswith("\n"):
        old += "\n"
    _replace(path, old + line + "\n")


def remove_key(path: Path, name: str) -> None:
    """Drop the line of the key named ``name`` (comments and other lines stay as they are),
    replacing the file whole like ``append_key``; a running server stops accepting the key at
    its next reload."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = [raw for raw in lines if raw.split("#", 1)[0].split()[:1] != [name]]
    if len(kept) == len(lines):
        raise KeyFileError(f"{path}: no key named {name!r}")
    _replace(path, "".join(kept))


def _replace(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        Path(tmp).chmod(0o600)
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class KeyStore:
    """The keys in force; ``authenticate`` runs on the event loop (one sha256, no IO)."""

    def __init__(self, path: Path, default: Quota, *, polling: bool = False) -> None:
        self.path = path
        self.default = default
        self.polling = polling
        """Poll instead of inotify (``TTSVC_WATCH_POLLING``, for filesystems without events)."""
        self.keys: list[ApiKey] = []
        self._stop = asyncio.Event()

    def load(self) -> None:
        """Read the key file (blocking: call from a thread, or before serving)."""
        self.keys = parse_keys(self.path.read_text(encoding="utf-8"), str(self.path),
                               self.default)  # fmt: skip

    def authenticate(self, authorization: str | None) -> ApiKey:
        """The key an ``Authorization: Bearer ...`` header carries, or ``Unauthorized``."""
        if not authorization:
            raise Unauthorized("an API key is required: Authorization: Bearer <key>",
                               presented=False)  # fmt: skip
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("use Authorization: Bearer <key>", presented=True)
        digest = hashlib.sha256(token.strip().encode()).digest()
        found: ApiKey | None = None
        for key in self.keys:  # no early exit: every entry costs the same
            if hmac.compare_digest(digest, key.digest):
                found = key
        if found is None:
            raise Unauthorized("the API key is not valid", presented=True)
        return found

    def stop(self) -> None:
        self._stop.set()

    async def watch(self, reloaded: Callable[[set[str]], None] | None = None) -> None:
        """Reload the file whenever its directory changes; a file that does not parse is logged
        and the keys in force stay. ``reloaded`` gets the names now in force."""
        async for _changes in awatch(self.path.parent, stop_event=self._stop, debounce=50,
                                     force_polling=self.polling, poll_delay_ms=200):  # fmt: skip
            try:
                await asyncio.to_thread(self.load)
            except (OSError, ValueError) as exc:
                log.error("keys_reload_failed", path=str(self.path), reason=str(exc))
                continue
            names = {k.name for k in self.keys}
            log.info("keys_reloaded", path=str(self.path), names=sorted(names))
            if reloaded is not None:
                reloaded(names)
