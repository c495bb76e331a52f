"""The pronunciation lexicons in force: every PLS file of ``<engines>/lexicons/``, hot-reloaded.

Lives in the gateway process; ``reload`` reads and parses files and is blocking (``refresh``
and ``watch`` run it in a thread, one at a time), everything else answers from memory. A request
takes ``current`` once, an immutable ``LexiconSet``, and keeps it however many reloads happen
while it runs: nothing in flight sees half of a change.

Verify, then swap, as engines are: a file is parsed whole (``ttsvc.text.lexicon``) before the
lexicon it defines replaces the one loaded; a file that does not parse is refused, with its line
and reason, in a ``lexicon_refused`` log line and in ``describe`` (``GET /lexicons``), and the
version loaded before keeps serving under that name. A file that is gone is dropped. A file
whose bytes did not change (a ``touch``, a ConfigMap update that left it as it was) is not
parsed again, and a refusal is not reported again until the file's bytes change.

A file being written in place is not refused while it still changes: a parse failure of a file
whose (size, mtime, inode) first showed up less than ``settle_s`` ago is looked at again once it
has kept still that long (a half-written XML file never parses: its root is not closed yet).
What is on disk at the first load is judged at once. Writing elsewhere and renaming into place,
as ``kubectl``'s ConfigMap updates do, is never seen half-done.

Names are file stems (``brands.pls`` defines ``brands``); ``*.pls`` and ``*.xml`` files are read
(Polly's and Azure's habits), hidden files and other names are not. Two files of one stem: the
first by name (``.pls`` before ``.xml``) loads, the other is refused.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import stat
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from watchfiles import Change, awatch

from ttsvc.errors import LexiconError
from ttsvc.observability.logs import get_logger
from ttsvc.repository.trust import TrustPolicy
from ttsvc.text.lexicon import MAX_FILE_BYTES, Lexicon, LexiconSet, parse_lexicon

__all__ = ["LEXICONS_DIR", "SUFFIXES", "LexiconStore", "LoadedLexicon", "Refusal", "Reload"]

log = get_logger("lexicons")

LEXICONS_DIR = "lexicons"
"""The directory under the engines directory that holds the lexicon files (no voice is named
so: the catalog must not take it for one)."""
SUFFIXES = (".pls", ".xml")
LOOK_AGAIN_S = 5.0
"""How often the watch looks at the files without an event (see ``LexiconStore.watch``)."""

FileState = tuple[int, int, int, int, int]
"""(size, mtime_ns, inode, mode, owner) of a file, through links: what says it changed, or that
whether it may be trusted may have (a ``chmod``, a ``chown``)."""


def _state(st: os.stat_result) -> FileState:
    return st.st_size, st.st_mtime_ns, st.st_ino, st.st_mode, st.st_uid


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class LoadedLexicon:
    """A lexicon in force and the file it came from."""

    lexicon: Lexicon
    file: str
    """The file's name in the lexicons directory (never a host path)."""
    sha256: str
    loaded_at: float
    """Wall-clock time of the load (seconds since the epoch)."""
    state: FileState

    def public(self) -> dict[str, object]:
        """The ``GET /lexicons`` entry."""
        lex = self.lexicon
        return {"name": lex.name, "lang": lex.lang, "lexemes": len(lex.entries),
                "file": self.file, "loaded_at": _iso(self.loaded_at),
                "sha256": self.sha256}  # fmt: skip


@dataclass(frozen=True)
class Refusal:
    """A file that may not be used, as it was when judged."""

    error: LexiconError
    name: str
    state: FileState | None
    sha256: str | None
    """Of the bytes refused (``None`` where they were never read: too large, not trusted)."""
    at: float
    serving: str | None = None
    """sha256 of the earlier version of this lexicon that still serves, if any."""

    def public(self) -> dict[str, object]:
        """The ``GET /lexicons`` entry: where and why, and whether an older version serves."""
        return {**self.error.public(), "name": self.name, "refused_at": _iso(self.at),
                "serving_sha256": self.serving}  # fmt: skip


@dataclass(frozen=True)
class Reload:
    """What one look at the lexicons directory changed."""

    loaded: tuple[str, ...] = ()
    """Names loaded or replaced."""
    dropped: tuple[str, ...] = ()
    """Names whose file is gone."""
    refused: tuple[str, ...] = ()
    """Files newly refused."""
    pending: tuple[str, ...] = ()
    """Files that did not parse but are still changing: looked at again in ``recheck_s``."""
    recheck_s: float | None = None

    @property
    def changed(self) -> bool:
        """Whether ``current`` is a new set."""
        return bool(self.loaded or self.dropped)


@dataclass(frozen=True)
class _View:
    """Everything ``describe`` and requests read, swapped as one."""

    loaded: dict[str, LoadedLexicon]
    refused: dict[str, Refusal]
    current: LexiconSet


class LexiconStore:
    """The lexicons of one engines directory (gateway process, its event loop; file work in a
    thread)."""

    def __init__(
        self,
        engines_dir: Path,
        *,
        settle_s: float = 5.0,
        polling: bool = False,
        trust: TrustPolicy | None = None,
        symbols: Collection[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        on_reload: Callable[[Reload], None] | None = None,
        look_again_s: float = LOOK_AGAIN_S,
        directory: Path | None = None,
    ) -> None:
        self.root = engines_dir.absolute()  # the watch reports paths under what it was given
        self.directory = (directory or self.root / LEXICONS_DIR).absolute()
        """Where the files are: ``<engines_dir>/lexicons`` unless told (a mount of its own)."""
        if directory is not None:
            self.root = self.directory.parent  # what the watch looks at for it to appear
        self.settle_s = settle_s
        """How long a file that does not parse must keep still before it is refused
        (``Settings.watch_settle_s``, as for engine files)."""
        self.polling = polling
        self.trust = trust
        """Who may own the files and where they may lead (``None``: no such check)."""
        self.symbols = symbols
        """Phoneme symbols a ``phoneme`` may use (``None``: any)."""
        self.clock = clock
        self.wall = wall
        self.on_reload = on_reload
        """Called on the event loop after each ``refresh``, whether it changed anything or not
        (metrics, tests)."""
        self.look_again_s = look_again_s
        self._view = _View({}, {}, LexiconSet())
        self._seen: dict[str, tuple[FileState, float]] = {}
        self._first = True
        self._lock = threading.Lock()
        self._stop = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def current(self) -> LexiconSet:
        """The lexicons in force now: take it once per request."""
        return self._view.current

    def describe(self) -> dict[str, list[dict[str, object]]]:
        """What ``GET /lexicons`` answers: the lexicons loaded, by name, and the files refused,
        by file name."""
        view = self._view
        return {
            "lexicons": [view.loaded[n].public() for n in sorted(view.loaded)],
            "refused": [view.refused[f].public() for f in sorted(view.refused)],
        }

    def _files(self) -> list[Path]:
        try:
            entries = list(self.directory.iterdir())
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(
            p for p in entries
            if not p.name.startswith(".") and p.suffix.lower() in SUFFIXES and p.is_file()
        )  # fmt: skip

    def _read(self, path: Path) -> tuple[bytes, FileState]:
        """The file's bytes (at most one past the cap) and the state of what was read."""
        with path.open("rb") as handle:
            st = os.fstat(handle.fileno())
            state = _state(st)
            if st.st_size > MAX_FILE_BYTES:
                return b"", state
            return handle.read(MAX_FILE_BYTES + 1), state

    def reload(self) -> Reload:
        """Look at every file, load what changed and parses, refuse what does not, drop what is
        gone; swap ``current`` once at the end (blocking: run in a thread)."""
        with self._lock:
            return self._reload()

    def _reload(self) -> Reload:
        now, wall = self.clock(), self.wall()
        old = self._view
        loaded: dict[str, LoadedLexicon] = {}
        refused: dict[str, Refusal] = {}
        seen: dict[str, tuple[FileState, float]] = {}
        fresh: list[str] = []
        newly_refused: list[str] = []
        pending: list[str] = []
        recheck: float | None = None
        claimed: dict[str, str] = {}
        for path in self._files():
            file, name = path.name, path.stem
            kept = old.loaded.get(name)
            if kept is not None and kept.file != file:
                kept = None  # another file of the same stem, now gone: not this one's past
            if name in claimed:
                why = f"lexicon {name!r} is already defined by {claimed[name]}"
                refusal = old.refused.get(file)
                if refusal is None or refusal.error.reason != why:
                    refusal = Refusal(LexiconError(file, why), name, None, None, wall)
                    newly_refused.append(file)
                    self._log_refusal(refusal)
                refused[file] = refusal
                continue
            claimed[name] = file
            try:
                state = _state(path.stat())
            except OSError:
                continue  # gone since it was listed
            if kept is not None and kept.state == state:
                loaded[name] = kept
                continue
            earlier = old.refused.get(file)
            if earlier is not None and earlier.state == state:
                refused[file] = earlier
                if kept is not None:
                    loaded[name] = kept
                continue
            outcome = self._judge(path, name, kept, earlier, wall)
            if isinstance(outcome, LoadedLexicon):
                loaded[name] = outcome
                if kept is None or outcome.sha256 != kept.sha256:
                    fresh.append(name)
                    log.info("lexicon_loaded", name=name, file=file, lang=outcome.lexicon.lang,
                             lexemes=len(outcome.lexicon.entries), sha256=outcome.sha256,
                             replaced=kept.sha256 if kept else None)  # fmt: skip
                continue
            if kept is not None:
                loaded[name] = kept
            if earlier is not None and outcome.sha256 and outcome.sha256 == earlier.sha256:
                refused[file] = replace(earlier, state=outcome.state)  # same bytes: said already
                continue
            if not self._first and self.settle_s > 0 and outcome.state is not None:
                first = self._seen.get(file)
                since = first[1] if first is not None and first[0] == outcome.state else now
                seen[file] = (outcome.state, since)
                wait = since + self.settle_s - now
                if wait > 0:
                    pending.append(file)
                    recheck = wait if recheck is None else min(recheck, wait)
                    if earlier is not None:
                        refused[file] = earlier
                    log.info("lexicon_pending", file=file, reason=outcome.error.reason,
                             recheck_s=round(wait, 3))  # fmt: skip
                    continue
            refusal = replace(outcome, serving=kept.sha256 if kept else None)
            refused[file] = refusal
            newly_refused.append(file)
            self._log_refusal(refusal)
        dropped = tuple(sorted(set(old.loaded) - set(loaded)))
        for name in dropped:
            log.info("lexicon_removed", name=name, file=old.loaded[name].file)
        current = old.current
        if fresh or dropped:
            current = LexiconSet({n: entry.lexicon for n, entry in loaded.items()})
        self._view = _View(loaded, refused, current)
        self._seen = seen
        self._first = False
        return Reload(tuple(fresh), dropped, tuple(newly_refused), tuple(pending), recheck)

    def _judge(
        self,
        path: Path,
        name: str,
        kept: LoadedLexicon | None,
        earlier: Refusal | None,
        wall: float,
    ) -> LoadedLexicon | Refusal:
        """Read, check and parse one changed file (its bytes are hashed before they are
        parsed: a file touched but not changed is not parsed again)."""
        file = path.name
        # the file only, through its links: the kubelet makes a ConfigMap volume's directory
        # mode 0777 (mounted read-only), and a file a stranger put in a directory is his
        if self.trust is not None and (why := self.trust.problem(path)) is not None:
            return Refusal(LexiconError(file, why), name, None, None, wall)
        try:
            data, state = self._read(path)
        except OSError as exc:
            return Refusal(LexiconError(file, f"cannot be read ({exc.strerror or exc})"), name,
                           None, None, wall)  # fmt: skip
        if state[0] > MAX_FILE_BYTES:
            error = LexiconError(file, f"the file has {state[0]} bytes, more than the "
                                 f"{MAX_FILE_BYTES} a lexicon may have")  # fmt: skip
            return Refusal(error, name, state, None, wall)
        sha = hashlib.sha256(data).hexdigest()
        if kept is not None and kept.sha256 == sha:
            return replace(kept, state=state)
        if earlier is not None and earlier.sha256 == sha:
            return replace(earlier, state=state)
        try:
            lexicon = parse_lexicon(data, file, name=name, symbols=self.symbols)
        except LexiconError as exc:
            return Refusal(exc, name, state, sha, wall)
        return LoadedLexicon(lexicon, file, sha, wall, state)

    def _log_refusal(self, refusal: Refusal) -> None:
        error = refusal.error
        log.error("lexicon_refused", file=error.file, line=error.line, column=error.column,
                  reason=error.reason, serving=refusal.serving)  # fmt: skip

    # --- on the event loop ----------------------------------------------------------------

    async def refresh(self) -> Reload:
        """``reload`` in a thread; a file still changing is looked at again once settled."""
        report = await asyncio.to_thread(self.reload)
        if report.recheck_s is not None:
            self._recheck(report.recheck_s)
        if self.on_reload is not None:
            self.on_reload(report)
        return report

    async def _refresh_logged(self) -> None:
        try:
            await self.refresh()
        except Exception:  # the watcher must outlive any one bad file
            log.exception("lexicons_reload_failed")

    def _recheck(self, delay: float) -> None:
        if self._stop.is_set():
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + max(0.0, delay)
        if self._timer is not None and self._timer.when() <= when:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(when, self._wake)

    def _wake(self) -> None:
        self._timer = None
        task = asyncio.ensure_future(self._refresh_logged())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def watch(self) -> None:
        """Reload on every change in the lexicons directory until stopped.

        Every change in the directory counts, hidden names too: a Kubernetes ConfigMap mount
        updates by swapping its ``..data`` link, and the files seen there are links through it.
        The engines directory is watched beside it (not recursively, for the ``lexicons`` entry
        only): a lexicons directory that appears, goes, or is replaced by another renamed into
        place leaves a watch on nothing, so any such change starts the watch again on what is
        there now. A change made while one watch ends and the next starts has no event, nor has
        one on a filesystem whose events are unreliable: the files are also looked at every
        ``look_again_s`` without an event (a stat per file; one that did not change is not read).
        """
        while not self._stop.is_set():
            identity = await asyncio.to_thread(self._identity)
            paths = (self.root, self.directory) if identity else (self.root,)
            try:
                async for changes in awatch(*paths, watch_filter=self._relevant, debounce=50,
                                            step=10, stop_event=self._stop,
                                            force_polling=self.polling, poll_delay_ms=50,
                                            recursive=False,
                                            rust_timeout=int(self.look_again_s * 1000),
                                            yield_on_timeout=True):  # fmt: skip
                    await self._refresh_logged()  # a batch of changes, or a quiet while
                    moved = any(Path(path) == self.directory for _change, path in changes)
                    if moved or await asyncio.to_thread(self._identity) != identity:
                        break  # appeared, gone or replaced: watch what is there now
            except FileNotFoundError:
                if await asyncio.to_thread(self.root.is_dir):
                    continue  # the lexicons directory went as the watch started
                log.warning("lexicons_unwatched", reason="the engines directory is missing")
                return
            if not self._stop.is_set():
                await self._refresh_logged()  # what changed between the two watches

    def _relevant(self, change: Change, path: str) -> bool:
        """watchfiles filter: the lexicons directory's own entry and everything in it."""
        where = Path(path)
        return self.directory in (where, where.parent)

    def _identity(self) -> tuple[int, int] | None:
        """Which lexicons directory is there (device and inode), ``None`` while there is none."""
        try:
            st = self.directory.stat()
        except OSError:
            return None
        return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None

    def stop(self) -> None:
        """End the watch and any re-check scheduled."""
        self._stop.set()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for task in self._tasks:
            task.cancel()

    @property
    def background(self) -> list[asyncio.Task[None]]:
        """Re-checks in progress (``stop`` cancels them; shutdown awaits them)."""
        return list(self._tasks)
