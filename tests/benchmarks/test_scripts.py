"""Every benchmark script still starts: its imports resolve against the package as it is now and
its flags parse (``--help``). A refactor that renames what a benchmark imports fails here, not
weeks later when someone needs the figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.benchmarks.conftest import BENCHMARKS
from ttsvc.repository.layout import EngineVersion
from ttsvc.repository.manifest import load_manifest

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


def test_engine_bench_runs_on_both_kinds_of_engines(
    default_version: EngineVersion, context_version: EngineVersion, tmp_path: Path
) -> None:
    """``--help`` alone missed that engine_bench wrapped a method the synthesizer no longer had:
    a tiny real run on each kind of engines (one sentence, one schedule) shows it measures."""
    for version in (default_version, context_version):
        out = tmp_path / f"{version.path.parent.parent.name}.json"
        result = subprocess.run(
            [sys.executable, str(BENCHMARKS / "engine_bench.py"), "--engines-dir",
             str(version.path.parent.parent), "--n", "1", "--repeat", "1", "--warmup", "0",
             "--loads", "1", "--schedules", "16:8:512", "--json", str(out)],
            capture_output=True, text=True, timeout=300, check=False,
            cwd=Path(BENCHMARKS).parent,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-2000:]
        document = json.loads(out.read_text(encoding="utf-8"))
        assert document["settings"]["streaming"] == load_manifest(version.path).streaming
        assert document["summary"]  # the variants were measured
