"""Hot swap: watch the voice's engines directory, verify candidates, roll them out.

Lives in the gateway process, on its event loop; file work runs in threads. Nothing here parses
an engine file: files are compared with their manifest (size, then sha256) and copied into the
engine cache; only workers parse. Watching the directory and comparing a version's files with its
manifest is ``ttsvc.repository.watcher``; this module is the gateway side: which version serves,
when to look again, staging and rolling out through the pool, and reporting rejections.

What serves is the newest *good* version: every listed file matches its manifest. A version that
does not is reported (``GET /voices``, an ``engine_rejected`` log line, the
``ttsvc_engine_rejected`` gauge and the ``rejected`` reload counter) and skipped for the one
below it, at start as later; with no good version the gateway stays up, unready, and starts its
workers as soon as one appears. Both ways of updating the HostPath are handled:

* **atomic publish** (``ttsvc compile``): a new numeric version directory appears with its
  manifest written last; it must match its manifest to be considered at all;
* **in-place replacement** (the operators' ``mv x.onnx x.onnx.bak; cp new.onnx x.onnx``): a file
  of the serving version changes. The only files that may differ from their manifest, because
  the staging worker's canary judges them, and only while that version serves: once a newer
  version serves, or after a restart, the version is judged by its manifest again and refused,
  as every pod refuses it (a replica must not serve what another refuses).

**Rollback** is withdrawing the serving version (its directory removed, or renamed to a
non-numeric name): the newest remaining version that verifies serves, its engines staged and
rolled out like any candidate, and one ``engine_fallback`` line says from what, to what and why
each version between was skipped (refused, or a file still changing). A fallback because no
worker could start on the serving version is said the same way.

A file is judged only once final: at once if it matches its manifest entry (a copy still running
cannot), else once its size, mtime and inode have stayed unchanged for ``settle_s``, which must be
longer than the pauses of a throttled copy, or a half-copied file would be judged. A file that
differs (a new engine, or a truncated one) is thus never parsed, or reported, while a copy runs.
What was seen of a file is kept while its version is present, also through scans that stop above
it: a file last seen unchanged long ago is final when a fallback reaches it.

A candidate is copied into the engine cache (hash while copying), then staged on one worker,
which loads it beside its serving engines and runs the canary; only then do workers switch, one
at a time. Same bytes as the serving set (a ``touch``) cause no reload; a rejected candidate is
not judged again until its bytes change; the serving engines never stop serving meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ttsvc.errors import EngineError
from ttsvc.observability.logs import get_logger
from ttsvc.observability.metrics import ServiceMetrics
from ttsvc.pool.supervisor import WorkerPool
from ttsvc.protocol import EngineSpec, StartFailed
from ttsvc.repository.cache import EngineCache, snapshot
from ttsvc.repository.layout import EngineRepository, EngineVersion
from ttsvc.repository.manifest import MANIFEST_NAME
from ttsvc.repository.trust import TrustPolicy
from ttsvc.repository.watcher import (
    Digests,
    FileState,
    Rejection,
    States,
    VersionCheck,
    check_version,
    load_manifest_json,
    relevant,
    watch_changes,
)

QUIET_NS = 1_000_000_000
"""How long a voice directory must have been unchanged when a rescan looks at it for that look
to stand for it until it changes (far above any file system's clock tick)."""

log = get_logger("hotswap")

RETRY_S = 1.0
"""How soon a candidate no worker could judge (none ready yet) is offered again."""

WITHDRAWN = "withdrawn: its directory or manifest is gone"
"""Why the serving version is left when it is no longer among the versions."""

SETTLING = "still changing, judged once it settles"
"""Why a version whose differing file has not settled yet is passed over for now."""


@dataclass(frozen=True)
class _Leaving:
    """The serving version a fallback leaves, until a rescan settles where to."""

    label: str
    source: str
    reason: str


class EngineSwapper:
    """Owns the serving engine spec of one voice and every change to it (gateway process)."""

    def __init__(
        self,
        root: Path,
        voice: str,
        cache: EngineCache,
        *,
        settle_s: float = 5.0,
        polling: bool = False,
        swap_timeout_s: float = 120.0,
        metrics: ServiceMetrics | None = None,
        start_pool: Callable[[EngineSpec], WorkerPool] | None = None,
        running: Callable[[], WorkerPool | None] | None = None,
        trust: TrustPolicy | None = None,
    ) -> None:
        self.repo = EngineRepository(root)
        self.trust = trust
        """Who may own the files served and where they may lie (``None``: no such check)."""
        self.voice = voice
        self.cache = cache
        self.settle_s = settle_s
        self.polling = polling
        self.swap_timeout_s = swap_timeout_s
        self.metrics = metrics
        self.start_pool = start_pool
        """Called once, with the first good spec, when no worker pool runs yet: starts the
        workers on it (the gateway's lifespan)."""
        self.running = running
        """The pool other voices already started, if any: this voice's first good version is
        then judged by a staging worker like any new version, and added to it."""
        self.pool: WorkerPool | None = None
        self.current: EngineSpec | None = None
        self.previous: EngineSpec | None = None
        self.reloads: Counter[str] = Counter()
        """Outcomes of candidates: ``ok``, ``rejected``."""
        self.last_error: str | None = None
        """The latest rejection, one line for clients (file name and short reason)."""
        self.rejected: dict[int, Rejection] = {}
        """Versions present that may not serve, by version."""
        self.pending: dict[int, Rejection] = {}
        """Versions with a file that differs from its manifest and is still changing."""
        self.deferred = False
        """A candidate waits for a worker to judge it (none ready yet): not a failure."""
        self.present = False
        """The voice had at least one complete version at the last look."""
        self._states: States | None = None
        self._source: Path | None = None
        self._judged: dict[object, Rejection] = {}
        self._failed: dict[tuple[object, ...], Rejection] = {}
        self._digests: Digests = {}
        self._seen: dict[str, tuple[FileState, float]] = {}
        self._leaving: _Leaving | None = None
        """The serving version being left (withdrawn, or no worker could start on it) until a
        rescan settles where to: then logged as one ``engine_fallback`` line."""
        self._fallback_said: tuple[object, ...] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()
        self._stop = asyncio.Event()
        self._scanned = asyncio.Event()
        """Set (and replaced) as each rescan ends: what requests waiting for the voice wake on."""
        self._look: asyncio.Task[None] | None = None
        self._looked: int | None = None
        """The voice directory's stamp (``_stamp``) as the last rescan began, if it had been
        quiet for ``QUIET_NS`` then: a request finding it unchanged need not look again."""
        self._look_began = False

    async def initial(self) -> EngineSpec | None:
        """Verify the versions present, newest first, and start serving the newest good one.

        ``None`` when there is none yet: the gateway stays up, unready, and ``watch`` starts the
        pool once a good version appears.
        """
        await self.rescan()
        if self.current is None and not self.deferred:
            log.warning("engine_none_verified", voice=self.voice,
                        rejected=[r.line() for r in self.rejected.values()],
                        pending=[r.line() for r in self.pending.values()])  # fmt: skip
        return self.current

    @property
    def verifying(self) -> bool:
        """A version is being judged or soon will be: a rescan runs (a candidate's copy, its
        canary on a staging worker), a candidate waits for a worker to judge it, or a file is
        still settling. Without one, a voice that does not serve will not by itself."""
        return self._lock.locked() or self.deferred or bool(self.pending)

    async def until_serving(self, timeout: float) -> bool:
        """Whether the voice serves, waiting up to ``timeout`` seconds while it is verified
        (a request for a voice just published, or found at start-up after the default one).

        The directory is looked at again first, by a rescan that begins after this call: a
        version renamed into place a moment ago may not have reached the watcher yet (its
        events come in batches). Not when ``timeout`` is 0 (the caller answers at once
        anyway), nor when the voice's directory is as the last rescan found it (requests under
        load would each rescan for nothing). The wait ends as soon as the voice serves, as soon
        as no version is being judged any more (then it will not serve by itself: the caller
        answers at once), or when the swapper stops (shutdown)."""
        if self.current is not None or self._stop.is_set() or timeout <= 0:
            return self.current is not None
        changed = self._looked is None or await asyncio.to_thread(self._stamp) != self._looked
        look = self._look_now() if changed else None

        async def settled() -> None:
            if look is not None:  # cancelled (a timeout), this leaves the rescan running
                await asyncio.wait({look})
            while self.current is None and self.verifying:
                await self._scanned.wait()

        waits = {asyncio.ensure_future(settled()), asyncio.ensure_future(self._stop.wait())}
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        return self.current is not None

    def _stamp(self) -> int | None:
        """The voice directory's modification time (ns; ``None``: unreadable), which a version
        renamed into it or out of it changes (blocking: run in a thread)."""
        try:
            return (self.repo.root / self.voice).stat().st_mtime_ns
        except OSError:
            return None

    def _look_now(self) -> asyncio.Task[None]:
        """A rescan that begins after this call: requests arriving together share one that has
        not begun yet."""
        if self._look is None or self._look_began:
            self._look_began = False
            self._look = asyncio.ensure_future(self._look_run())
            self._tasks.add(self._look)
            self._look.add_done_callback(self._tasks.discard)
        return self._look

    async def _look_run(self) -> None:
        self._look_began = True
        await self._rescan_logged()

    def _publish_info(self, spec: EngineSpec, precision: dict[str, str] | None = None) -> None:
        if self.metrics is None:
            return
        manifest = load_manifest_json(spec.manifest)
        found = precision or manifest.precision
        label = "/".join(f"{k}:{v}" for k, v in sorted(found.items()))
        self.metrics.set_engine(spec.voice, spec.label, manifest.backend, label)

    def stop(self) -> None:
        """End the watch loop and any re-check still scheduled."""
        self._stop.set()
        if self._timer is not None:
            self._timer.cancel()
        for task in self._tasks:
            task.cancel()

    @property
    def background(self) -> list[asyncio.Task[None]]:
        """Re-checks in progress (``stop`` cancels them; shutdown awaits them)."""
        return list(self._tasks)

    async def watch(self) -> None:
        """React to changes under ``<root>/<voice>`` until stopped."""
        voice_dir = self.repo.root / self.voice
        async for _changes in watch_changes(voice_dir, relevant, self._stop, self.polling):
            await self._rescan_logged()

    async def _rescan_logged(self) -> None:
        try:
            await self.rescan()
        except Exception:  # the watcher must outlive any one bad candidate
            log.exception("rescan_failed")

    def _recheck(self, delay: float) -> None:
        """Look again in ``delay`` seconds: a file settles without any further event."""
        if self._stop.is_set():
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + max(0.0, delay)
        if self._timer is not None and not self._timer.cancelled() and self._timer.when() <= when:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(when, self._wake)

    def _wake(self) -> None:
        self._timer = None
        task = asyncio.ensure_future(self._rescan_logged())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _settle_wait(
        self, check: VersionCheck, now: float, seen: dict[str, tuple[FileState, float]]
    ) -> float:
        """Seconds until every file that differs from its manifest has stayed unchanged for
        ``settle_s`` (0: final now). A matching file is final at once: it cannot be mid-copy."""
        wait = 0.0
        for name in check.problems:
            path = str(check.version.path / name)
            state = check.states.get(name)
            first = self._seen.get(path)
            if first is None or first[0] != state:
                first = (state, now)
            seen[path] = first
            wait = max(wait, first[1] + self.settle_s - now)
        return wait

    async def rescan(self) -> None:
        """Find the newest version that may serve and roll it out if it is new and verified.

        When the serving version is gone (withdrawn), the newest remaining version that
        verifies serves: one whose files do not match its manifest is refused like any other
        that is not serving (the canary judged replaced files only while they served), and the
        fallback is logged once it lands, with the reason each version above it was skipped.
        Requests waiting for the voice (``until_serving``) look again when it ends.
        """
        try:
            await self._rescan()
        finally:
            scanned, self._scanned = self._scanned, asyncio.Event()
            scanned.set()

    async def _rescan(self) -> None:
        async with self._lock:
            began, stamp = time.time_ns(), await asyncio.to_thread(self._stamp)
            # a change in the same tick of the file system's clock as the look may not show in
            # the stamp: only a directory quiet for a while is taken as seen
            quiet = stamp is not None and began - stamp > QUIET_NS
            self._looked = stamp if quiet else None
            versions = await asyncio.to_thread(self.repo.versions, self.voice)
            self.present = bool(versions)
            if (self.current is not None and self._source is not None
                    and all(v.path != self._source for v in versions)):  # fmt: skip
                if self._leaving is None or self._leaving.source != str(self._source):
                    self._leaving = _Leaving(self.current.label, str(self._source), WITHDRAWN)
            skipped: list[str] = []
            landed: str | None = None
            now = time.monotonic()
            seen: dict[str, tuple[FileState, float]] = {}
            digests: Digests = {}
            rejected: dict[int, Rejection] = {}
            pending: dict[int, Rejection] = {}
            judged: dict[object, Rejection] = {}
            visited: set[int] = set()
            for version in reversed(versions):
                check = await asyncio.to_thread(check_version, version, self._digests,
                                                self.trust)  # fmt: skip
                digests.update((k, self._digests[k]) for k in self._digest_keys(check))
                serving = self.current is not None and version.path == self._source
                if serving and check.states == self._states:
                    break  # the serving version, unchanged: nothing newer may serve
                visited.add(version.version)
                if (refusal := check.refusal()) is not None:  # whoever may write it chose it
                    if check.key() not in self._judged:
                        self._reject(refusal, version.path)
                    judged[check.key()] = rejected[version.version] = refusal
                    if serving:
                        break  # the cached copy of what was verified keeps serving
                    skipped.append(refusal.line())
                    continue
                wait = self._settle_wait(check, now, seen)
                if wait > 0:
                    name, reason = next(iter(check.problems.items()))
                    pending[version.version] = settling = Rejection(version.version, name, reason)
                    self._recheck(wait)
                    if serving:
                        break
                    skipped.append(f"{settling.line()} ({SETTLING})")
                    continue
                if serving and not check.complete:
                    break  # a file of the serving version is gone: keep serving from the cache
                if (known := self._judged.get(check.key())) is not None:
                    judged[check.key()] = rejected[version.version] = known
                    if serving:
                        break
                    skipped.append(known.line())
                    continue
                if check.problems and not serving:
                    name, reason = next(iter(check.problems.items()))
                    rejection = Rejection(version.version, name, reason)
                    self._reject(rejection, version.path)
                    judged[check.key()] = rejected[version.version] = rejection
                    skipped.append(rejection.line())
                    continue
                outcome = await self._try(version, check, serving)
                if isinstance(outcome, Rejection):
                    judged[check.key()] = rejected[version.version] = outcome
                    if serving:
                        break
                    skipped.append(outcome.line())
                    continue
                landed = outcome
                break  # serving it now, the same bytes, or to be looked at again
            else:
                landed = "none"  # every version looked at, none may serve
            present = {v.version for v in versions}
            floor = self.current.version if self.current is not None else 0
            kept = {v: r for v, r in self.rejected.items()
                    if v in present and v not in visited and v >= floor}  # fmt: skip
            self.rejected = {**kept, **rejected}
            self.pending = pending
            self._judged = {**{k: r for k, r in self._judged.items() if r in kept.values()},
                            **judged}  # fmt: skip
            # a file is final once unchanged for settle_s, however long ago it was last looked
            # at: a version this scan did not reach keeps what was seen of its files, so the
            # replaced file of a version that served is not "still changing" when it serves no
            # longer (the clock would start again, and a fallback pass over it unjudged)
            unvisited = {str(v.path) for v in versions if v.version not in visited}
            earlier = {p: s for p, s in self._seen.items() if str(Path(p).parent) in unvisited}
            self._seen, self._digests = {**earlier, **seen}, digests
            if self.metrics is not None:
                refused = [(str(r.version), r.file or "") for r in self.rejected.values()]
                self.metrics.set_rejected(self.voice, refused)
            if self._leaving is not None and landed in ("swapped", "same", "none"):
                self._say_fallback(self._leaving, skipped, landed != "none")

    def _say_fallback(self, leaving: _Leaving, skipped: list[str], landed: bool) -> None:
        """One ``engine_fallback`` line: the version left and why, the one serving now (none:
        no version may serve, and the cached copy of a withdrawn one keeps serving), and why
        each version between them was skipped. Until it lands, a rescan that finds the same
        again says nothing more."""
        to = self.current if landed else None
        said = (leaving, tuple(skipped))
        if not landed and said == self._fallback_said:
            return
        self._fallback_said = None if landed else said
        if landed:
            self._leaving = None
        log.warning("engine_fallback", voice=self.voice, from_version=leaving.label,
                    to_version=to.label if to else None, reason=leaving.reason,
                    skipped=skipped, from_source=leaving.source,
                    to_source=str(self._source) if to else None)  # fmt: skip

    def _digest_keys(self, check: VersionCheck) -> list[tuple[str, FileState]]:
        keys = [(str(check.version.path / n), s) for n, s in check.states.items()]
        return [k for k in keys if k in self._digests]

    async def _try(
        self, version: EngineVersion, check: VersionCheck, serving: bool
    ) -> Rejection | str:
        """Admit a version whose files are final into the cache and serve it if a worker agrees.

        Returns the rejection, or what happened: ``swapped``, ``same``, ``retry``.
        """
        directory = version.path
        try:
            spec = await asyncio.to_thread(snapshot, self.cache, directory, self.voice)
        except (EngineError, OSError):
            self._recheck(self.settle_s)  # changed or gone since the check: look again
            return "retry"
        if spec.replaced and not serving:
            self._recheck(self.settle_s)  # it matched a moment ago: it is changing again
            return "retry"
        if self.current is None and self.pool is None:
            self.pool = self.running() if self.running is not None else None
            if self.pool is None:
                self._serve_first(spec, check.states, directory)
                return "swapped"
        key = _failure_key(spec)
        if (failed := self._failed.get(key)) is not None:
            if serving:
                self._states = check.states
            return Rejection(version.version, failed.file, failed.reason)
        if self.current is None and self.pool is not None and self.pool.held_for(self.voice):
            # the version workers started on could not serve: they start on this one instead
            self._serve_first(spec, check.states, directory)
            return "swapped"
        if (self.current is not None and spec.files == self.current.files
                and spec.manifest == self.current.manifest):  # fmt: skip
            self._states, self._source = check.states, directory  # same bytes: no reload
            return "same"
        log.info("engine_candidate", voice=self.voice, source=str(directory),
                 replaced=list(spec.replaced))  # fmt: skip
        assert self.pool is not None
        reply = await self.pool.rollout(spec, self.swap_timeout_s)
        self.deferred = False
        if not reply.ok:
            if reply.worker < 0:  # not judged (no worker ready, one died): offer it again
                # at start-up the workers are still loading: expected, not worth a warning
                level = log.info if self.current is None else log.warning
                level("engine_candidate_deferred", voice=self.voice, reason=reply.reason)
                self.deferred = True
                self._recheck(RETRY_S)
                return "retry"
            rejection = _judged(spec, reply.reason)
            self._failed[key] = rejection
            if serving:  # not judged again until its bytes change
                self._states = check.states
            self._reject(rejection, directory, reply.detail)
            return rejection
        first = self.current is None
        self.previous, self.current = self.current, spec
        self._states, self._source = check.states, directory
        self._publish_info(spec, reply.precision)
        if first:  # a voice added to a running pool: its first version, not a reload
            log.info("engine_serving", voice=self.voice, engine_version=spec.label,
                     source=str(directory), precision=reply.precision)  # fmt: skip
            return "swapped"
        self.reloads["ok"] += 1
        if self.metrics is not None:
            self.metrics.engine_reloads.labels("ok").inc()
        keep = set(spec.files.values())
        if self.previous is not None:
            keep |= set(self.previous.files.values())
        await asyncio.to_thread(self.cache.prune, keep)
        log.info("engine_swapped", voice=self.voice, engine_version=spec.label,
                 source=str(directory), replaced=list(spec.replaced),
                 precision=reply.precision)  # fmt: skip
        return "swapped"

    def _serve_first(self, spec: EngineSpec, states: States, directory: Path) -> None:
        """The first good version: workers start on it (at start, once one appears, or after
        the one they started on could not serve). Workers judge it as they start: one that
        cannot load it or whose canary fails says so (``start_failed``)."""
        self.current = spec
        self._states, self._source = states, directory
        self._publish_info(spec)
        log.info("engine_serving", voice=self.voice, engine_version=spec.label,
                 source=str(directory))  # fmt: skip
        if self.pool is not None:
            self.pool.retarget(spec)
        elif self.start_pool is not None:
            self.pool = self.start_pool(spec)

    def start_failed(self, failed: StartFailed) -> None:
        """Workers could not start on this voice's serving version (it failed to load, or its
        canary) and none serves it: reject it as a failed candidate is rejected, then serve the
        next older good version (``rescan``). Called on the event loop by the pool."""
        task = asyncio.ensure_future(self._fall_back(failed))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _fall_back(self, failed: StartFailed) -> None:
        async with self._lock:
            current = self.current
            if current is None or current.label != failed.label:
                return  # another worker's report of the same version, or replaced meanwhile
            rejection = _judged(current, failed.reason)
            self._failed[_failure_key(current)] = rejection
            self._reject(rejection, Path(current.source), failed.detail)
            self._leaving = _Leaving(current.label, current.source,
                                     f"workers could not start on it: {failed.reason}")  # fmt: skip
            self.current = None
            self._states = self._source = None
        await self._rescan_logged()

    def _reject(self, rejection: Rejection, directory: Path, detail: str = "") -> None:
        """Count, list and log a new rejection (once per distinct bytes): listed at once, with
        its count, so that ``GET /voices`` never shows one without the other while a rescan
        goes on (the rescan's end sets the whole list again)."""
        self.rejected[rejection.version] = rejection
        self.reloads["rejected"] += 1
        if self.metrics is not None:
            self.metrics.engine_reloads.labels("rejected").inc()
        self.last_error = rejection.line()
        log.error("engine_rejected", voice=self.voice, version=rejection.version,
                  file=rejection.file, reason=rejection.reason, detail=detail or None,
                  source=str(directory),
                  serving=self.current.label if self.current else None)  # fmt: skip


def _failure_key(spec: EngineSpec) -> tuple[str, ...]:
    """What a judgement of a spec's files holds for: its manifest and the bytes it names."""
    return (spec.manifest, *(f"{name}:{sha}" for name, sha in sorted(spec.files.items())))


def _judged(spec: EngineSpec, reason: str) -> Rejection:
    """The rejection of ``spec`` a worker's reason makes: ``file: reason`` where the worker
    named the file at fault, else (the set failed as a whole: the canary) the files replaced in
    place are suspected."""
    head, sep, tail = reason.partition(": ")
    if sep and (head in spec.files or head == MANIFEST_NAME):
        return Rejection(spec.version, head, tail)
    return Rejection(spec.version, ", ".join(spec.replaced) or None, reason)
