"""The scripted pool as a fixture (see ``tests.pool.scripted``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.pool.scripted import Pool


@pytest.fixture
def pool() -> Iterator[Pool]:
    p = Pool()
    yield p
    p.close()
