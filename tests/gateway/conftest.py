"""Fixtures shared by the gateway tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.serving import Server
from ttsvc.repository.layout import EngineVersion


@pytest.fixture(scope="module")
def server(default_version: EngineVersion, engines_root: Path) -> Iterator[Server]:
    """A real ``ttsvc serve`` with one worker on the default voice, per test module (a module
    that needs other flags defines its own ``server``)."""
    srv = Server(engines_root, "--workers", "1")
    srv.wait_ready(1)
    yield srv
    srv.stop()
