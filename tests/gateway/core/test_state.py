"""Which voice a request names, and when it may be answered (``GatewayState.resolve_voice``).

A real catalogue of voices over a real engines directory (real files, a real rename), on the
scripted pool: the test speaks for the one worker that stages a new voice, so the request's wait
for a voice still being verified, and its end once the worker answers, are seen in process.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from tests.gateway.core.conftest import VOICE, Core
from ttsvc.errors import ClientClosedRequest, EngineError, UnknownVoice
from ttsvc.gateway.core.caller import Caller
from ttsvc.gateway.core.records import record_refusal
from ttsvc.lifecycle.catalog import VoiceCatalog
from ttsvc.lifecycle.swapper import EngineSwapper
from ttsvc.protocol import EnginesSwapped, SwapEngines
from ttsvc.repository.cache import EngineCache
from ttsvc.repository.layout import EngineVersion

NEW = "en_US-new-medium"
"""A voice that appears while the service runs."""
GUARD_S = 120.0
"""Bound on each await of these tests: a deadlock guard (a regression fails, it does not hang
for the 600 s wait of ``root``), not a timing assertion."""


@pytest.fixture
def logs() -> Iterator[list[structlog.typing.EventDict]]:
    with structlog.testing.capture_logs() as captured:
        yield captured


@pytest.fixture
def root(core: Core, tmp_path: Path) -> Iterator[Path]:
    """An engines directory whose voices ``core``'s state serves through a real catalogue (no
    watcher runs: what a request finds, it finds by looking itself). Requests may wait for a
    voice as long as the test needs: a wait that should not happen would hang the test."""
    engines = tmp_path / "engines"
    engines.mkdir()
    cache = tmp_path / "cache"

    def make(name: str) -> EngineSwapper:
        return EngineSwapper(engines, name, EngineCache(cache / name),
                             running=lambda: core.state.pool)  # fmt: skip

    catalog = core.state.catalog = VoiceCatalog(engines, VOICE, make)
    core.state.settings = core.settings.model_copy(update={"voice_wait_s": 600.0})
    core.ready()
    yield engines
    catalog.stop()  # as shutdown does: the voices' watches and a staging in progress end

    async def ended() -> None:
        background = catalog.background
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)

    core.run(asyncio.wait_for(ended(), GUARD_S))


def _publish(root: Path, version: EngineVersion) -> None:
    """``version``'s files published as ``NEW`` version 1, as ``ttsvc compile`` publishes: a
    staging directory inside the voice's directory, renamed into place."""
    staging = root / NEW / ".staging-test"
    shutil.copytree(version.path, staging)
    staging.rename(root / NEW / "1")


def test_a_voice_published_a_moment_ago_is_waited_for_and_then_answers(
    core: Core, root: Path, default_version: EngineVersion
) -> None:
    """The rename has not reached any watcher: the request looks itself, the voice is staged on
    the worker, and the request goes on once the worker's canary passed; from then on the voice
    is ready alike for ``/health`` and ``GET /voices``, and answers at once."""
    (root / NEW).mkdir()  # as the compile's staging directory made it, long before
    _publish(root, default_version)

    async def scenario() -> str:
        caller = Caller()
        asked = asyncio.ensure_future(core.state.resolve_voice(NEW, caller))
        staged = await asyncio.to_thread(core.handle.outbox.get, True, GUARD_S)
        assert isinstance(staged, SwapEngines) and staged.spec.voice == NEW and staged.load
        assert not asked.done()  # waiting for the voice, not refused
        assert core.state.voice_state(NEW) == "verifying"
        assert core.state.ready_voices() == []  # the scripted worker serves no voice yet
        core.say(EnginesSwapped(0, staged.spec.label, True, "", staged.seq))
        voice = await asyncio.wait_for(asked, GUARD_S)
        assert caller.voice == NEW
        return voice

    assert core.run(asyncio.wait_for(scenario(), GUARD_S)) == NEW
    assert core.state.voice_state(NEW) == "serving"
    assert NEW in core.state.ready_voices()
    serving = asyncio.wait_for(core.state.resolve_voice(NEW), GUARD_S)
    assert core.run(serving) == NEW  # serving: no look, no staging
    assert core.sent() == []


def test_a_voice_with_no_version_to_judge_is_refused_at_once_and_its_record_names_it(
    core: Core, root: Path, logs: list[structlog.typing.EventDict]
) -> None:
    """A voice directory with no version yet (a compile still running) is not waited for: no
    version is being judged, so none will serve by itself. Its refusal, and an unknown name's,
    are recorded under the voice the request asked for, not the default voice."""
    (root / NEW / ".staging-test").mkdir(parents=True)
    caller = Caller()
    with pytest.raises(EngineError):
        core.run(asyncio.wait_for(core.state.resolve_voice(NEW, caller), GUARD_S))
    assert core.state.voice_state(NEW) == "no_engine"
    record_refusal(core.state, caller, EngineError("x").to_body(), 503)
    unknown = Caller()
    with pytest.raises(UnknownVoice):
        core.run(asyncio.wait_for(core.state.resolve_voice("nobody", unknown), GUARD_S))
    record_refusal(core.state, unknown, UnknownVoice("x").to_body(), 404)
    lines = [entry for entry in logs if entry["event"] == "request"]
    assert [(line["voice"], line["code"]) for line in lines] == [(NEW, 503), ("nobody", 404)]
    assert core.sent() == []  # no worker was asked to judge anything


def _counted(swapper: EngineSwapper) -> list[str]:
    """Each listing of ``swapper``'s versions (one per rescan), counted from now."""
    looks: list[str] = []
    versions = swapper.repo.versions

    def counting(voice: str) -> list[EngineVersion]:
        looks.append(voice)
        return versions(voice)

    swapper.repo.versions = counting  # type: ignore[method-assign]
    return looks


def _refused(core: Core, voice: str, wait_s: float) -> None:
    core.state.settings = core.settings.model_copy(update={"voice_wait_s": wait_s})
    with pytest.raises(EngineError):
        core.run(asyncio.wait_for(core.state.resolve_voice(voice), GUARD_S))


def test_requests_for_a_voice_that_does_not_serve_rescan_only_when_its_directory_changed(
    core: Core, root: Path
) -> None:
    """Under load every request for a voice with no version used to rescan its directory. Now
    none does with ``voice_wait_s`` 0 (it answers at once anyway), and with a wait, only the
    first after the directory changed does."""
    (root / NEW / ".staging-test").mkdir(parents=True)
    long_ago = time.time() - 3600
    os.utime(root / NEW, (long_ago, long_ago))
    _refused(core, NEW, 600.0)  # the catalogue finds it and looks once
    swapper = core.state.catalog.get(NEW) if core.state.catalog is not None else None
    assert swapper is not None
    looks = _counted(swapper)
    for _ in range(5):
        _refused(core, NEW, 600.0)
    assert looks == []  # unchanged since the last look: no rescan
    os.utime(root / NEW)  # the directory changes (as a rename into it changes it)
    for _ in range(5):
        _refused(core, NEW, 0.0)
    assert looks == []  # no wait, no look
    _refused(core, NEW, 600.0)
    assert looks == [NEW]  # changed: looked at again, once


def test_names_that_are_no_voice_directory_are_never_scanned_for(core: Core, root: Path) -> None:
    """The lexicons' directory (and a staging directory) is a good name but no voice: a request
    naming it is unknown at once, without the catalogue scanning the root each time."""
    (root / "lexicons").mkdir()
    assert core.state.catalog is not None
    scans: list[str | None] = []
    scan = core.state.catalog.scan

    async def counting(wait_for: str | None = None) -> None:
        scans.append(wait_for)
        await scan(wait_for)

    core.state.catalog.scan = counting  # type: ignore[method-assign]
    for _ in range(3):
        with pytest.raises(UnknownVoice):
            core.run(asyncio.wait_for(core.state.resolve_voice("lexicons"), GUARD_S))
    assert scans == []


def _waiting(core: Core, root: Path, default_version: EngineVersion,
             caller: Caller) -> asyncio.Future[str]:  # fmt: skip
    """A request for ``NEW``, published now, once its worker was asked to stage it (the request
    then waits for the worker's answer)."""
    (root / NEW).mkdir()
    _publish(root, default_version)
    asked = asyncio.ensure_future(core.state.resolve_voice(NEW, caller), loop=core.loop)
    staged = core.run(asyncio.to_thread(core.handle.outbox.get, True, GUARD_S))
    assert isinstance(staged, SwapEngines) and staged.spec.voice == NEW
    assert not asked.done()
    return asked


def test_a_client_that_leaves_ends_its_wait_for_the_voice(
    core: Core, root: Path, default_version: EngineVersion
) -> None:
    """The wait for a voice being verified used to go on for a client that had left (up to
    ``voice_wait_s``): now it ends as that client's 499."""
    left = asyncio.Event()
    asked = _waiting(core, root, default_version, Caller(gone=left.wait))
    left.set()
    with pytest.raises(ClientClosedRequest):
        core.run(asyncio.wait_for(asked, GUARD_S))


def test_the_wait_for_a_voice_ends_when_the_service_stops(
    core: Core, root: Path, default_version: EngineVersion
) -> None:
    """Shutdown stops the catalogue: a request waiting for a voice is answered (503) then,
    not left waiting out ``voice_wait_s``."""
    asked = _waiting(core, root, default_version, Caller())
    assert core.state.catalog is not None
    core.state.catalog.stop()
    with pytest.raises(EngineError):
        core.run(asyncio.wait_for(asked, GUARD_S))
