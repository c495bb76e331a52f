"""Which voice a request names, and when it may be answered (``GatewayState.resolve_voice``).

A real catalogue of voices over a real engines directory (real files, a real rename), on the
scripted pool: the test speaks for the one worker that stages a new voice, so the request's wait
for a voice still being verified, and its end once the worker answers, are seen in process.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from tests.gateway.core.conftest import VOICE, Core
from ttsvc.errors import EngineError, UnknownVoice
from ttsvc.gateway.core.caller import Caller
from ttsvc.gateway.core.records import record_refusal
from ttsvc.lifecycle.catalog import VoiceCatalog
from ttsvc.lifecycle.swapper import EngineSwapper
from ttsvc.protocol import EnginesSwapped, SwapEngines
from ttsvc.repository.cache import EngineCache
from ttsvc.repository.layout import EngineVersion

NEW = "en_US-new-medium"
"""A voice that appears while the service runs."""


@pytest.fixture
def logs() -> Iterator[list[structlog.typing.EventDict]]:
    with structlog.testing.capture_logs() as captured:
        yield captured


@pytest.fixture
def root(core: Core, tmp_path: Path) -> Path:
    """An engines directory whose voices ``core``'s state serves through a real catalogue (no
    watcher runs: what a request finds, it finds by looking itself). Requests may wait for a
    voice as long as the test needs: a wait that should not happen would hang the test."""
    engines = tmp_path / "engines"
    engines.mkdir()
    cache = tmp_path / "cache"

    def make(name: str) -> EngineSwapper:
        return EngineSwapper(engines, name, EngineCache(cache / name),
                             running=lambda: core.state.pool)  # fmt: skip

    core.state.catalog = VoiceCatalog(engines, VOICE, make)
    core.state.settings = core.settings.model_copy(update={"voice_wait_s": 600.0})
    core.ready()
    return engines


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
        staged = await asyncio.to_thread(core.handle.outbox.get, True, 60)
        assert isinstance(staged, SwapEngines) and staged.spec.voice == NEW and staged.load
        assert not asked.done()  # waiting for the voice, not refused
        assert core.state.voice_state(NEW) == "verifying"
        assert core.state.ready_voices() == []  # the scripted worker serves no voice yet
        core.say(EnginesSwapped(0, staged.spec.label, True, "", staged.seq))
        voice = await asked
        assert caller.voice == NEW
        return voice

    assert core.run(scenario()) == NEW
    assert core.state.voice_state(NEW) == "serving"
    assert NEW in core.state.ready_voices()
    assert core.run(core.state.resolve_voice(NEW)) == NEW  # serving: no look, no staging
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
        core.run(core.state.resolve_voice(NEW, caller))
    assert core.state.voice_state(NEW) == "no_engine"
    record_refusal(core.state, caller, EngineError("x").to_body(), 503)
    unknown = Caller()
    with pytest.raises(UnknownVoice):
        core.run(core.state.resolve_voice("nobody", unknown))
    record_refusal(core.state, unknown, UnknownVoice("x").to_body(), 404)
    lines = [entry for entry in logs if entry["event"] == "request"]
    assert [(line["voice"], line["code"]) for line in lines] == [(NEW, 503), ("nobody", 404)]
    assert core.sent() == []  # no worker was asked to judge anything
