"""The compile tests take every core while they run: they hold the run's machine lock shared,
so a test that measures real time (``tests/gateway/test_realtime.py``) never runs beside one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import machine


@pytest.fixture(autouse=True)
def _busy_machine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with machine(tmp_path_factory, quiet=False):
        yield
