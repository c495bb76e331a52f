"""Fixtures shared by the gateway tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.serving import Server, keyed_server, write_keys
from ttsvc.repository.layout import EngineVersion


@pytest.fixture(scope="module")
def server(default_version: EngineVersion, engines_root: Path) -> Iterator[Server]:
    """A real ``ttsvc serve`` with one worker on the default voice, per test module (a module
    that needs other flags defines its own ``server``)."""
    srv = Server(engines_root, "--workers", "1")
    srv.wait_ready(1)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def keys(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, str]]:
    """A key file with a key for each name in the module's ``KEY_NAMES`` (default ``alice``),
    no quota: the file and the keys by name."""
    path = tmp_path_factory.mktemp("keys") / "keys"
    names = getattr(request.module, "KEY_NAMES", ("alice",))
    return path, write_keys(path, {name: {} for name in names})


@pytest.fixture(scope="module")
def keyed(
    default_version: EngineVersion, engines_root: Path, keys: tuple[Path, dict[str, str]]
) -> Iterator[Server]:
    """A real ``ttsvc serve`` with one worker and the module's keys on, its client sending
    ``alice``'s key."""
    path, names = keys
    with keyed_server(engines_root, path, names["alice"]) as srv:
        yield srv


@pytest.fixture(scope="module")
def key(keys: tuple[Path, dict[str, str]]) -> str:
    """``alice``'s key."""
    return keys[1]["alice"]
