"""Every voice under the engines directory, served at once, each with its own hot swap.

Lives in the gateway process, on its event loop. A team mounts the voices it needs as
``<root>/<voice>/<version>/``; each voice gets its own ``EngineSwapper`` (its versions, its
rejections, its swaps), so publishing or breaking one voice never touches another. A voice
directory that appears while the service runs is picked up without a restart: the root is
watched (not recursively: each swapper watches its own voice).

The default voice is looked at first, so the workers start on it when it verifies; every other
voice's first good version is then judged by a staging worker like any new version, and workers
load it when a request first needs it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path

from watchfiles import Change

from ttsvc.lifecycle.lexicons import LEXICONS_DIR
from ttsvc.lifecycle.swapper import EngineSwapper
from ttsvc.observability.logs import get_logger
from ttsvc.protocol import EngineSpec, StartFailed
from ttsvc.repository.layout import STAGING_PREFIX
from ttsvc.repository.watcher import watch_changes
from ttsvc.voice import name_problem

log = get_logger("catalog")


def voice_names(root: Path) -> list[str]:
    """Directories directly under ``root`` that may hold a voice (blocking: run in a thread);
    the pronunciation lexicons' directory is not one."""
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and _may_be_voice(p.name))


def _may_be_voice(name: str) -> bool:
    """A name under the root that may be a voice's directory: not hidden, not a staging
    directory, not the lexicons' directory."""
    return not name.startswith((".", STAGING_PREFIX)) and name != LEXICONS_DIR


def _top_level(change: Change, path: str) -> bool:
    """watchfiles filter: names that may be voices (hidden and staging names never are, nor the
    lexicons' directory, whose changes are the lexicon store's)."""
    name = Path(path).name
    return not name.startswith(".") and name != LEXICONS_DIR


class VoiceCatalog:
    """The swappers of every voice found under one engines directory (gateway process)."""

    def __init__(
        self,
        root: Path,
        default: str,
        make: Callable[[str], EngineSwapper],
        *,
        polling: bool = False,
    ) -> None:
        self.root = root
        self.default = default
        """The voice for requests that name none: looked at first, so workers start on it."""
        self.make = make
        self.polling = polling
        self.swappers: dict[str, EngineSwapper] = {}
        self._watches: set[asyncio.Task[None]] = set()
        self._stop = asyncio.Event()
        self._lock = asyncio.Lock()

    async def initial(self) -> None:
        """Verify the default voice (the workers start on it when it is good) before returning;
        every other voice present is verified in the background, so start-up does not wait on
        copying, hashing and judging them one after another."""
        await self.scan(wait_for=self.default)

    async def scan(self, wait_for: str | None = None) -> None:
        """Add a swapper for every voice directory not known yet; each verifies its versions and
        watches its directory in the background (``wait_for``'s first look is awaited here)."""
        async with self._lock:
            names = await asyncio.to_thread(voice_names, self.root)
            names.sort(key=lambda name: name != self.default)  # stable: the rest by name
            fresh = [name for name in names if name not in self.swappers]
            for name in fresh:
                self.swappers[name] = self.make(name)
                if name != self.default:
                    log.info("voice_found", voice=name)
        for name in fresh:
            if self._stop.is_set():
                return
            swapper = self.swappers[name]
            if name == wait_for:
                await swapper.initial()
                self._spawn(swapper.watch())
            else:
                self._spawn(self._start(swapper))

    async def _start(self, swapper: EngineSwapper) -> None:
        try:
            await swapper.initial()
        except Exception:  # one unreadable voice must not stop it being watched, nor the others
            log.exception("voice_scan_failed", voice=swapper.voice)
        await swapper.watch()

    def _spawn(self, work: Coroutine[None, None, None]) -> None:
        task = asyncio.ensure_future(work)
        self._watches.add(task)
        task.add_done_callback(self._watches.discard)

    async def watch(self) -> None:
        """Pick up voice directories that appear under the root until stopped."""
        async for _changes in watch_changes(self.root, _top_level, self._stop, self.polling,
                                            recursive=False):  # fmt: skip
            try:
                await self.scan()
            except Exception:  # the watcher must outlive any one bad voice directory
                log.exception("voice_scan_failed")

    def stop(self) -> None:
        """End every watch and any re-check still scheduled."""
        self._stop.set()
        for swapper in self.swappers.values():
            swapper.stop()

    @property
    def background(self) -> list[asyncio.Task[None]]:
        """The voices' watches and re-checks (``stop`` ends them; shutdown awaits them)."""
        tasks = list(self._watches)
        for swapper in self.swappers.values():
            tasks.extend(swapper.background)
        return tasks

    def start_failed(self, failed: StartFailed) -> None:
        """Workers could not start on ``failed.voice``'s serving version: its swapper judges it
        (the pool calls this, on the event loop)."""
        swapper = self.swappers.get(failed.voice)
        if swapper is not None:
            swapper.start_failed(failed)

    def serving(self) -> dict[str, EngineSpec]:
        """Each voice's serving engines, for voices with a good version."""
        return {name: s.current for name, s in self.swappers.items() if s.current is not None}

    def get(self, voice: str) -> EngineSwapper | None:
        """The swapper of ``voice`` (known to the catalog, serving or not)."""
        return self.swappers.get(voice)

    async def find(self, voice: str) -> EngineSwapper | None:
        """The swapper of ``voice``, looking under the root first when the catalog does not
        know it yet: a voice directory renamed into place a moment ago may not have reached the
        watcher (its events come in batches), and a request for it must not be told it is
        unknown."""
        swapper = self.swappers.get(voice)
        if (swapper is not None or self._stop.is_set() or name_problem(voice) is not None
                or not _may_be_voice(voice)):  # fmt: skip
            return swapper
        if await asyncio.to_thread((self.root / voice).is_dir):
            await self.scan()
        return self.swappers.get(voice)
