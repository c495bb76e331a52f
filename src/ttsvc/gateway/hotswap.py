"""Hot swap: watch the voice's engines directory, verify candidates, roll them out.

Lives in the gateway process, on its event loop; file work runs in threads. Both ways of
updating the HostPath are handled:

* **atomic publish** (``ttsvc compile``): a new numeric version directory appears with its
  manifest written last; the highest complete version is the candidate;
* **in-place replacement** (the operators' ``mv x.onnx x.onnx.bak; cp new.onnx x.onnx``): a file
  of the serving version changes; once its size, mtime and inode stop changing for
  ``settle_s``, it is the candidate, whether or not it matches the manifest.

A candidate is copied into the engine cache (hash while copying), then staged on one worker,
which loads it beside its serving engines and runs the canary; only then do workers switch, one
at a time. Same bytes as the serving set (a ``touch``) cause no reload; a rejected candidate is
not retried until its bytes change; the serving engines never stop serving meanwhile.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from watchfiles import Change, awatch

from ttsvc.errors import EngineError
from ttsvc.observability.logs import get_logger
from ttsvc.observability.metrics import ServiceMetrics
from ttsvc.pool.supervisor import WorkerPool
from ttsvc.protocol import EngineSpec
from ttsvc.repository.cache import EngineCache, file_state, snapshot
from ttsvc.repository.layout import STAGING_PREFIX, EngineRepository
from ttsvc.repository.manifest import MANIFEST_NAME, Manifest, load_manifest


def load_manifest_json(text: str) -> Manifest:
    """A spec's manifest (validated JSON, metadata only)."""
    return Manifest.model_validate_json(text)


log = get_logger("hotswap")

NOISE_SUFFIXES = (".bak", ".swp", ".swx", ".swo", "~", ".tmp", ".part", ".partial", ".crdownload")
"""Names an editor, a copy tool or an operator's backup leaves: never a candidate by themselves."""

States = dict[str, tuple[int, int, int] | None]


def relevant(change: Change, path: str) -> bool:
    """watchfiles filter: ignore backups, editor swap files, temp names and staging dirs."""
    name = Path(path).name
    if name.startswith(".") or name.startswith(STAGING_PREFIX):
        return False
    return not name.endswith(NOISE_SUFFIXES)


def version_states(directory: Path) -> States | None:
    """File states of a version (its manifest and every file it lists); None if unreadable."""
    try:
        manifest = load_manifest(directory)
    except EngineError:
        return None
    names = [MANIFEST_NAME, *manifest.files]
    states: States = {name: file_state(directory / name) for name in names}
    return None if any(state is None for state in states.values()) else states


class EngineSwapper:
    """Owns the serving engine spec of one voice and every change to it (gateway process)."""

    def __init__(
        self,
        root: Path,
        voice: str,
        cache: EngineCache,
        *,
        settle_s: float = 0.1,
        polling: bool = False,
        swap_timeout_s: float = 120.0,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        self.repo = EngineRepository(root)
        self.voice = voice
        self.cache = cache
        self.settle_s = settle_s
        self.polling = polling
        self.swap_timeout_s = swap_timeout_s
        self.metrics = metrics
        self.current: EngineSpec | None = None
        self.previous: EngineSpec | None = None
        self.reloads: Counter[str] = Counter()
        """Outcomes of candidates: ``ok``, ``rejected``."""
        self.last_error: str | None = None
        self._states: States | None = None
        self._source: Path | None = None
        self._failed: set[tuple[object, ...]] = set()
        self._lock = asyncio.Lock()
        self._stop = asyncio.Event()

    async def initial(self) -> EngineSpec:
        """The spec workers start on: the highest complete version, copied into the cache."""
        latest = await asyncio.to_thread(self.repo.latest, self.voice)
        if latest is None:
            raise EngineError(f"no complete engine version for {self.voice} in {self.repo.root}")
        states = await asyncio.to_thread(version_states, latest.path)
        self.current = await asyncio.to_thread(snapshot, self.cache, latest.path, self.voice)
        self._states, self._source = states, latest.path
        self._publish_info(self.current)
        return self.current

    def _publish_info(self, spec: EngineSpec) -> None:
        if self.metrics is None:
            return
        manifest = load_manifest_json(spec.manifest)
        precision = "/".join(f"{k}:{v}" for k, v in sorted(manifest.precision.items()))
        self.metrics.set_engine(spec.voice, spec.label, manifest.backend, precision)

    def stop(self) -> None:
        """End the watch loop."""
        self._stop.set()

    async def watch(self, pool: WorkerPool) -> None:
        """React to changes under ``<root>/<voice>`` until stopped."""
        voice_dir = self.repo.root / self.voice
        async for _changes in awatch(
            voice_dir,
            watch_filter=relevant,
            debounce=50,
            step=10,
            stop_event=self._stop,
            force_polling=self.polling,
            poll_delay_ms=50,
        ):
            try:
                await self.rescan(pool)
            except Exception:  # the watcher must outlive any one bad candidate
                log.exception("rescan_failed")

    async def rescan(self, pool: WorkerPool) -> None:
        """Look for a candidate and roll it out if it is complete, new and verified."""
        async with self._lock:
            latest = await asyncio.to_thread(self.repo.latest, self.voice)
            if latest is None or self.current is None:
                return
            directory = latest.path
            states = await asyncio.to_thread(version_states, directory)
            if states is None:
                return  # a file is missing or the manifest unreadable: wait for the next change
            if directory == self._source and states == self._states:
                return
            for _ in range(600):  # a copy still running keeps changing; bounded: ~60 s at 0.1 s
                await asyncio.sleep(self.settle_s)
                settled = await asyncio.to_thread(version_states, directory)
                if settled is None:
                    return
                if settled == states:
                    break
                states = settled
            else:
                return
            log.info("engine_candidate", voice=self.voice, source=str(directory))
            try:
                spec = await asyncio.to_thread(snapshot, self.cache, directory, self.voice)
            except EngineError as exc:
                return self._reject(directory, None, exc.message)
            if spec.files == self.current.files and spec.manifest == self.current.manifest:
                self._states, self._source = states, directory  # same bytes: no reload
                return
            key = (spec.manifest, *sorted(spec.files.items()))
            if key in self._failed:
                return
            ok, reason, final = await pool.rollout(spec, self.swap_timeout_s)
            if not ok:
                if final:  # judged by a worker: not retried until its bytes change
                    self._failed.add(key)
                    self._states, self._source = states, directory
                return self._reject(directory, spec, reason)
            self.previous, self.current = self.current, spec
            self._states, self._source = states, directory
            self.reloads["ok"] += 1
            if self.metrics is not None:
                self.metrics.engine_reloads.labels("ok").inc()
            self._publish_info(spec)
            keep = set(spec.files.values()) | set(self.previous.files.values())
            await asyncio.to_thread(self.cache.prune, keep)
            log.info("engine_swapped", voice=self.voice, engine_version=spec.label,
                     source=str(directory), replaced=list(spec.replaced))  # fmt: skip

    def _reject(self, directory: Path, spec: EngineSpec | None, reason: str) -> None:
        self.reloads["rejected"] += 1
        if self.metrics is not None:
            self.metrics.engine_reloads.labels("rejected").inc()
        self.last_error = reason
        files = list(spec.replaced) if spec is not None and spec.replaced else None
        log.error("engine_rejected", voice=self.voice, source=str(directory), files=files,
                  reason=reason,
                  serving=self.current.label if self.current else None)  # fmt: skip
