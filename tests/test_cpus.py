"""The CPUs the pool plans for, read from real cgroup files laid out under tmp_path."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ttsvc.cpus import (
    CpuBudget,
    available_cpus,
    cgroup_quota,
    complete_split,
    cpu_budget,
    default_split,
)

CORES = len(os.sched_getaffinity(0))
"""The CPUs this test process may run on: every budget is bounded by them."""


def cgroup_v2(root: Path, cpu_max: str) -> Path:
    root.mkdir(exist_ok=True)
    (root / "cpu.max").write_text(cpu_max + "\n")
    return root


def cgroup_v1(root: Path, quota: int, period: int, directory: str = "cpu,cpuacct") -> Path:
    controller = root / directory
    controller.mkdir(parents=True)
    (controller / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (controller / "cpu.cfs_period_us").write_text(f"{period}\n")
    return root


@pytest.fixture
def one_core() -> Iterator[int]:
    """Pin this process to one CPU for the test (an affinity mask, as a cpuset sets), so a quota
    of more than one CPU is bounded by it; the mask is restored afterwards."""
    saved = os.sched_getaffinity(0)
    core = min(saved)
    os.sched_setaffinity(0, {core})
    try:
        yield core
    finally:
        os.sched_setaffinity(0, saved)


def test_v2_quota_in_whole_cpus(tmp_path: Path) -> None:
    root = cgroup_v2(tmp_path, "100000 100000")
    assert cgroup_quota(root) == (1.0, "cgroup v2 quota")
    assert cpu_budget(root) == CpuBudget(1, "cgroup v2 quota")


def test_v2_max_is_no_limit(tmp_path: Path) -> None:
    root = cgroup_v2(tmp_path, "max 100000")
    assert cgroup_quota(root) is None
    assert cpu_budget(root) == CpuBudget(CORES, "affinity")


def test_fractional_quota_rounds_up(tmp_path: Path) -> None:
    root = cgroup_v2(tmp_path, "150000 100000")
    assert cgroup_quota(root) == (1.5, "cgroup v2 quota")
    assert available_cpus(root) == min(2, CORES)


def test_quota_under_one_cpu_still_plans_one(tmp_path: Path) -> None:
    root = cgroup_v2(tmp_path, "25000 100000")
    assert cpu_budget(root) == CpuBudget(1, "cgroup v2 quota")


@pytest.mark.parametrize("directory", ["cpu", "cpu,cpuacct"])
def test_v1_quota(tmp_path: Path, directory: str) -> None:
    root = cgroup_v1(tmp_path, 50000, 100000, directory)
    assert cgroup_quota(root) == (0.5, "cgroup v1 quota")
    assert cpu_budget(root) == CpuBudget(1, "cgroup v1 quota")


def test_hybrid_layout_reads_the_v1_cpu_controller(tmp_path: Path) -> None:
    """systemd's hybrid mode: a v2 tree under ``unified/`` without the cpu controller, the
    quota in v1's ``cpu/``."""
    (tmp_path / "unified").mkdir()
    (tmp_path / "unified" / "cgroup.controllers").write_text("\n")
    root = cgroup_v1(tmp_path, 100000, 100000, "cpu")
    assert cpu_budget(root) == CpuBudget(1, "cgroup v1 quota")


def test_v1_unlimited_quota(tmp_path: Path) -> None:
    root = cgroup_v1(tmp_path, -1, 100000)
    assert cgroup_quota(root) is None
    assert cpu_budget(root) == CpuBudget(CORES, "affinity")


def test_no_cgroup_files_falls_back_to_affinity(tmp_path: Path) -> None:
    assert cgroup_quota(tmp_path / "absent") is None
    assert cpu_budget(tmp_path / "absent") == CpuBudget(CORES, "affinity")


def test_unparsable_file_is_no_limit(tmp_path: Path) -> None:
    assert cgroup_quota(cgroup_v2(tmp_path, "lots 100000")) is None
    assert cgroup_quota(cgroup_v2(tmp_path, "")) is None


def test_affinity_bounds_a_larger_quota(tmp_path: Path, one_core: int) -> None:
    root = cgroup_v2(tmp_path, "800000 100000")
    assert cpu_budget(root) == CpuBudget(1, "affinity")
    assert cpu_budget(cgroup_v1(tmp_path / "v1", 300000, 100000)) == CpuBudget(1, "affinity")


def test_quota_equal_to_the_affinity_mask_is_named_as_the_source(
    tmp_path: Path, one_core: int
) -> None:
    assert cpu_budget(cgroup_v2(tmp_path, "100000 100000")) == CpuBudget(1, "cgroup v2 quota")


@pytest.mark.parametrize(
    ("cpus", "deadline"),
    [(1, (1, 1)), (2, (1, 2)), (4, (1, 4)), (5, (2, 3)), (6, (2, 3)), (8, (2, 4)),
     (16, (4, 4)), (64, (16, 4))],
)  # fmt: skip
def test_default_split(cpus: int, deadline: tuple[int, int]) -> None:
    assert default_split(cpus) == deadline
    processes, threads = deadline
    # every CPU has a thread, and no process is left without a share
    assert processes * threads >= cpus > (processes - 1) * threads


def test_split_stays_within_the_settings_bounds() -> None:
    assert default_split(4096) == (256, 16)


def test_given_values_are_kept_and_the_rest_fills_the_cpus() -> None:
    assert complete_split(8, 4, None) == (4, 2)
    assert complete_split(8, None, 3) == (3, 3)
    assert complete_split(8, 3, 5) == (3, 5)
    assert complete_split(2, 4, None) == (4, 1)
    assert complete_split(8, None, None) == (2, 4)
