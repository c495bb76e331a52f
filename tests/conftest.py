"""Shared fixtures: the real default voice, compiled once per test session into a temp dir."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from tests.speakers import derive_multi_speaker
from tests.voices import SECOND_VOICE, derive_checkpoint
from ttsvc.backends.base import EngineSet
from ttsvc.backends.loader import load_engine_set
from ttsvc.compile.build import compile_voice, default_checkpoint, ensure_default_voice
from ttsvc.compile.inputs import CompileOptions
from ttsvc.config import DEFAULT_VOICE
from ttsvc.repository.layout import EngineRepository, EngineVersion
from ttsvc.synthesis import Synthesizer
from ttsvc.voice import VoiceConfig


def _run_dir(factory: pytest.TempPathFactory) -> Path:
    """This run's directory, shared by its xdist workers (the session's own without xdist)."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


_SHARED_HELD = [0]
"""How deeply this process holds the machine lock shared (a test's compile nests in the test's
own hold, and must not queue behind a measuring test that waits for that very hold to end)."""


@contextlib.contextmanager
def machine(factory: pytest.TempPathFactory, *, quiet: bool) -> Iterator[None]:
    """Hold the run's machine lock: shared for every test (taken around each one by the hooks
    below) and for a compile, exclusive (``quiet``) for the call of a test that measures real
    time (marked ``realtime``), so that nothing else in the run computes while it measures:
    under pytest-xdist the other worker's tests, or a server it starts, would take half the
    cores the test says it has, and its streams would run dry by chance (CI went red so).

    A turnstile gives the exclusive side precedence: a measuring test holds it while it waits,
    so the other worker's next test waits behind it instead of starving it (``flock`` grants a
    shared request while an exclusive one waits)."""
    run = _run_dir(factory)
    if not quiet and _SHARED_HELD[0]:
        _SHARED_HELD[0] += 1  # already shared by this process: a nested hold takes nothing
        try:
            yield
        finally:
            _SHARED_HELD[0] -= 1
        return
    with (run / "machine.turnstile").open("w") as gate, (run / "machine.lock").open("w") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX if quiet else fcntl.LOCK_SH)
        if quiet:
            yield  # both held (released on close): no shared hold starts until this ends
            return
        fcntl.flock(gate, fcntl.LOCK_UN)
        _SHARED_HELD[0] += 1
        try:
            yield
        finally:
            _SHARED_HELD[0] -= 1


def _measures(item: pytest.Item) -> bool:
    return item.get_closest_marker("realtime") is not None


def _hold(item: pytest.Item, *, quiet: bool) -> contextlib.AbstractContextManager[None]:
    """The machine lock for one phase of a ``realtime`` test (nothing for any other test)."""
    if not _measures(item):
        return contextlib.nullcontext()
    return machine(item.config._tmp_path_factory, quiet=quiet)  # type: ignore[attr-defined]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """Every test runs, setup to teardown, under the machine lock's shared side (see
    ``machine``); one marked ``realtime`` holds it around its setup and teardown only (a server
    starting computes as much as any test), and around its call, exclusively."""
    if _measures(item):
        yield
        return
    with machine(item.config._tmp_path_factory, quiet=False):  # type: ignore[attr-defined]
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with _hold(item, quiet=False):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with _hold(item, quiet=True):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    with _hold(item, quiet=False):
        yield


def shared_build(
    factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]
) -> Path:
    """A directory ``build`` fills once per test run, for the session fixtures to copy from.

    Under pytest-xdist each worker is a session of its own and would compile every voice again;
    their temp directories share a parent, so the first worker to ask builds there under a file
    lock and the others wait and reuse it. Without xdist it is the session's own directory.
    """
    base = _run_dir(factory)
    target = base / f"shared-{name}"
    with (base / f"shared-{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (target / ".complete").exists():
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir()
            with machine(factory, quiet=False):
                build(target)
            (target / ".complete").touch()
    return target


@pytest.fixture(scope="session")
def engines_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh engines directory for the session.

    ``TTSVC_TEST_ENGINES`` may name a directory already holding the compiled default voice: it is
    copied in (never used in place, tests may change their copy), which saves a developer the
    compile on every run. CI leaves it unset and compiles, as a new user would. Only the default
    voice is copied: the servers that share this directory serve one voice (the prebuilt one may
    also hold the derived second voice, for ``second_voice_root``).
    """
    root = tmp_path_factory.mktemp("engines")
    prebuilt = os.environ.get("TTSVC_TEST_ENGINES")
    if prebuilt and (Path(prebuilt) / DEFAULT_VOICE).is_dir():
        shutil.copytree(Path(prebuilt) / DEFAULT_VOICE, root / DEFAULT_VOICE)
        return root
    shared = shared_build(tmp_path_factory, "default",
                          lambda d: ensure_default_voice(d, lambda _msg: None))  # fmt: skip
    shutil.copytree(shared / DEFAULT_VOICE, root / DEFAULT_VOICE)
    return root


@pytest.fixture(scope="session")
def default_version(engines_root: Path) -> EngineVersion:
    return ensure_default_voice(engines_root, lambda _msg: None)


@pytest.fixture(scope="session")
def second_voice_root(
    tmp_path_factory: pytest.TempPathFactory, default_version: EngineVersion
) -> Path:
    """An engines directory of two voices: the compiled default voice and the derived second one
    (``tests/voices.py``), compiled by the real ``ttsvc compile --checkpoint`` as a user would.

    Its own directory, not ``engines_root``, whose servers must keep serving one voice. Where
    ``TTSVC_TEST_ENGINES`` holds a compiled ``en_GB-derived-low`` it is copied instead of compiled
    (a minute saved per run; the compile itself is proven in tests/compile/test_other_voice.py).
    """
    root = tmp_path_factory.mktemp("engines-two-voices")
    shutil.copytree(default_version.path, root / DEFAULT_VOICE / str(default_version.version))
    prebuilt = os.environ.get("TTSVC_TEST_ENGINES")
    if prebuilt and (Path(prebuilt) / SECOND_VOICE).is_dir():
        shutil.copytree(Path(prebuilt) / SECOND_VOICE, root / SECOND_VOICE)
        return root

    def build(target: Path) -> None:
        model, _ = derive_checkpoint(tmp_path_factory.mktemp("derived-checkpoint"))
        result = subprocess.run(
            [sys.executable, "-m", "ttsvc.cli", "compile", "--checkpoint", str(model),
             "--output-dir", str(target)],
            capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr

    shutil.copytree(shared_build(tmp_path_factory, "second", build) / SECOND_VOICE,
                    root / SECOND_VOICE)  # fmt: skip
    return root


@pytest.fixture(scope="session")
def context_version(tmp_path_factory: pytest.TempPathFactory) -> EngineVersion:
    """The default voice compiled as context engines (``--streaming context``): windows that
    recompute their context, what TensorRT plans are and what stateful engines are compared
    with. Its own engines directory; ``TTSVC_TEST_ENGINES``/context may hold a prebuilt one."""
    root = tmp_path_factory.mktemp("context-engines")
    prebuilt = os.environ.get("TTSVC_TEST_ENGINES")
    if prebuilt and (Path(prebuilt) / "context" / DEFAULT_VOICE).is_dir():
        shutil.copytree(Path(prebuilt) / "context" / DEFAULT_VOICE, root / DEFAULT_VOICE)
        version = EngineRepository(root).latest(DEFAULT_VOICE)
        assert version is not None
        return version
    model, config = default_checkpoint()
    shared = shared_build(tmp_path_factory, "context", lambda d: compile_voice(
        CompileOptions(model, config, d, DEFAULT_VOICE, streaming="context")))  # fmt: skip
    shutil.copytree(shared / DEFAULT_VOICE, root / DEFAULT_VOICE)
    version = EngineRepository(root).latest(DEFAULT_VOICE)
    assert version is not None
    return version


@pytest.fixture(scope="session")
def context_synth(context_version: EngineVersion) -> Synthesizer:
    return Synthesizer(load_engine_set(context_version.path))


@pytest.fixture(scope="session")
def engine_set(default_version: EngineVersion) -> EngineSet:
    return load_engine_set(default_version.path)


@pytest.fixture(scope="session")
def synth(engine_set: EngineSet) -> Synthesizer:
    return Synthesizer(engine_set)


@pytest.fixture(scope="session")
def voice_config() -> VoiceConfig:
    _, config = default_checkpoint()
    return VoiceConfig.load(config)


@pytest.fixture(scope="session")
def piper_graph() -> Iterator[ort.InferenceSession]:
    """The unsplit Piper voice graph, the reference every engine is compared with."""
    model, _ = default_checkpoint()
    yield ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="session")
def multi_speaker_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A three-speaker voice derived from the packaged one (``tests/speakers.py``)."""
    return derive_multi_speaker(tmp_path_factory.mktemp("multi-speaker"))


@pytest.fixture(scope="session")
def multi_speaker_version(
    multi_speaker_checkpoint: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> EngineVersion:
    """The derived voice compiled once per session, into its own engines directory (the
    shared one holds the default voice alone, as the gateway tests expect)."""
    model, config = multi_speaker_checkpoint
    root = tmp_path_factory.mktemp("multi-speaker-engines")
    shared = shared_build(tmp_path_factory, "trio", lambda d: compile_voice(
        CompileOptions(model, config, d, "en_US-trio-medium")))  # fmt: skip
    shutil.copytree(shared / "en_US-trio-medium", root / "en_US-trio-medium")
    version = EngineRepository(root).latest("en_US-trio-medium")
    assert version is not None
    return version


@pytest.fixture(scope="session")
def multi_speaker_synth(multi_speaker_version: EngineVersion) -> Synthesizer:
    return Synthesizer(load_engine_set(multi_speaker_version.path))


@pytest.fixture(scope="session")
def multi_speaker_graph(
    multi_speaker_checkpoint: tuple[Path, Path],
) -> Iterator[ort.InferenceSession]:
    """The unsplit derived graph: the reference for every speaker."""
    yield ort.InferenceSession(str(multi_speaker_checkpoint[0]),
                               providers=["CPUExecutionProvider"])  # fmt: skip


def run_piper(
    session: ort.InferenceSession,
    ids: tuple[int, ...],
    scales: list[float],
    speaker: int | None = None,
) -> np.ndarray:  # type: ignore[type-arg]
    """Audio of the unsplit graph for ``ids`` (``speaker``: the ``sid`` of a multi-speaker
    graph)."""
    feed = {
        "input": np.asarray([ids], dtype=np.int64),
        "input_lengths": np.asarray([len(ids)], dtype=np.int64),
        "scales": np.asarray(scales, dtype=np.float32),
    }
    if speaker is not None:
        feed["sid"] = np.asarray([speaker], dtype=np.int64)
    return np.asarray(session.run(None, feed)[0]).reshape(-1)


def read_json(path: Path) -> dict[str, object]:
    data = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data
