"""Every benchmark script still starts: its imports resolve against the package as it is now and
its flags parse (``--help``). A refactor that renames what a benchmark imports fails here, not
weeks later when someone needs the figure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.benchmarks.conftest import BENCHMARKS

SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py"))


def test_every_script_is_listed() -> None:
    assert "seed_bench.py" in SCRIPTS and "failure_bench.py" in SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_benchmark_script_starts(script: str) -> None:
    result = subprocess.run([sys.executable, str(BENCHMARKS / script), "--help"],
                            capture_output=True, text=True, timeout=120, check=False,
                            cwd=Path(BENCHMARKS).parent)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage:" in result.stdout
