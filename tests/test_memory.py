"""A worker's memory cap, sized from the settings and a container limit read from real cgroup
files laid out under tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

from ttsvc.memory import GATEWAY_MB, WORKER_BASE_MB, WORKER_MIN_MB, cgroup_memory_limit
from ttsvc.memory import worker_memory_mb as cap


@pytest.mark.parametrize(
    ("files", "limit"),
    [
        ({"memory.max": "2147483648\n"}, 2 << 30),
        ({"memory.max": "max\n"}, None),
        ({"memory/memory.limit_in_bytes": "1073741824\n"}, 1 << 30),
        ({"memory/memory.limit_in_bytes": "9223372036854771712\n"}, None),  # v1's "none"
        ({"memory.max": "garbage\n"}, None),
        ({}, None),
    ],
)
def test_the_container_limit_is_read_from_either_cgroup_version(
    tmp_path: Path, files: dict[str, str], limit: int | None
) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_memory_limit(tmp_path) == limit


def test_a_worker_may_take_its_voices_and_the_runtime_within_its_share_of_the_pod() -> None:
    assert cap(1024, 1, None) == 1024 + WORKER_BASE_MB
    assert cap(0, 1, None) == 0  # no voice budget and no container limit: no cap
    pod = 2 << 30
    assert cap(1024, 1, pod) == 2048 - GATEWAY_MB  # the pod's limit, less the gateway's part
    assert cap(1024, 2, pod) == (2048 - GATEWAY_MB) / 2
    assert cap(0, 2, pod) == (2048 - GATEWAY_MB) / 2
    assert cap(1024, 16, pod) == WORKER_MIN_MB  # never below what one voice needs
    assert cap(100, 1, 8 << 30) == 100 + WORKER_BASE_MB
