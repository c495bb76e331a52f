"""The `ttsvc` command as a user runs it: a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ttsvc.audio.wav import read_wav
from ttsvc.cli import _overrides, build_parser
from ttsvc.config import Settings
from ttsvc.pool.cpus import CpuBudget, cpu_budget, default_split
from ttsvc.repository.layout import EngineVersion


def _ttsvc(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ttsvc.cli", *args],
        cwd=cwd, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip


def test_synth_writes_wav_and_reports_ttfa_and_rtf(
    default_version: EngineVersion, engines_root: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out.wav"
    result = _ttsvc("synth", "Hello from the command line.", "-o", str(out),
                    "--engines-dir", str(engines_root), cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "first chunk" in result.stdout and "real-time factor" in result.stdout
    pcm, rate = read_wav(out)
    assert rate == 22050
    assert 0.8 < len(pcm) / rate < 5.0


def test_synth_nothing_to_say_is_a_clear_error(engines_root: Path, tmp_path: Path) -> None:
    result = _ttsvc("synth", "🎉🎉", "--engines-dir", str(engines_root), cwd=tmp_path)
    assert result.returncode == 1
    assert "nothing to speak" in result.stderr
    assert "Traceback" not in result.stderr


def test_synth_bad_speed_is_a_clear_error(engines_root: Path, tmp_path: Path) -> None:
    result = _ttsvc("synth", "Hi.", "--speed", "0", "--engines-dir", str(engines_root),
                    cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2
    assert "speed" in result.stderr and "Traceback" not in result.stderr


def test_compile_trt_exits_with_clear_message(tmp_path: Path) -> None:
    result = _ttsvc("compile", "--backend", "trt", "--output-dir", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 1
    assert "TensorRT" in result.stderr and "Traceback" not in result.stderr


def test_engines_ls(default_version: EngineVersion, engines_root: Path, tmp_path: Path) -> None:
    result = _ttsvc("engines", "ls", "--engines-dir", str(engines_root), cwd=tmp_path)
    assert result.returncode == 0
    assert "* en_US-joe-medium v1 ort fp32/fp32" in result.stdout


def test_serve_says_it_binds_loopback_by_default(tmp_path: Path) -> None:
    result = _ttsvc("serve", "--help", cwd=tmp_path)
    assert result.returncode == 0
    assert "default 127.0.0.1" in " ".join(result.stdout.split())


def test_admission_flags_reach_the_settings() -> None:
    args = build_parser().parse_args(["serve", "--default-key-streams", "3", "--max-audio-s",
                                      "120", "--no-api-docs"])  # fmt: skip
    settings = Settings(**_overrides(args))  # type: ignore[arg-type]
    assert settings.default_key_streams == 3 and settings.max_audio_s == 120
    assert settings.api_docs is False
    plain = Settings(**_overrides(build_parser().parse_args(["serve"])))  # type: ignore[arg-type]
    assert (plain.host, plain.default_key_streams, plain.api_docs) == ("127.0.0.1", None, True)


def split_settings(*flags: str) -> Settings:
    return Settings(**_overrides(build_parser().parse_args(["serve", *flags])))  # type: ignore[arg-type]


def split(*flags: str) -> tuple[int, int]:
    """Worker processes x compute threads of ``ttsvc serve FLAGS`` with this environment."""
    settings = split_settings(*flags)
    return settings.workers, settings.compute_threads


@pytest.fixture
def no_ttsvc_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for key in [k for k in os.environ if k.startswith("TTSVC_")]:
        monkeypatch.delenv(key)
    return monkeypatch


def test_default_split_follows_the_cpus_this_process_may_use(no_ttsvc_env: object) -> None:
    settings = Settings()
    budget = cpu_budget()  # this machine's real cgroup files and affinity mask
    assert settings.cpu_budget() == budget
    assert (settings.workers, settings.compute_threads) == default_split(budget.cpus, "deadline")
    assert (settings.scheduler, settings.realtime_load) == ("deadline", 0.9)


def test_split_flags_reach_the_settings(no_ttsvc_env: object) -> None:
    assert split("--cpus", "8") == (2, 4)
    legacy = split_settings("--cpus", "8", "--scheduler", "legacy", "--realtime-load", "0.5")
    assert (legacy.workers, legacy.compute_threads, legacy.scheduler) == (8, 1, "legacy")
    assert legacy.realtime_load == 0.5
    assert split("--cpus", "8", "--compute-threads", "2") == (4, 2)
    assert split("--cpus", "8", "--workers", "3", "--compute-threads", "1") == (3, 1)
    assert split_settings("--cpus", "8").cpu_budget() == CpuBudget(8, "cpus setting")


def test_explicit_split_wins_flags_over_environment(no_ttsvc_env: pytest.MonkeyPatch) -> None:
    no_ttsvc_env.setenv("TTSVC_CPUS", "8")
    no_ttsvc_env.setenv("TTSVC_WORKERS", "3")
    assert split() == (3, 3)  # the 8 CPUs spread over the 3 processes
    assert split("--workers", "1") == (1, 8)
    no_ttsvc_env.setenv("TTSVC_COMPUTE_THREADS", "2")
    assert split() == (3, 2)
    no_ttsvc_env.setenv("TTSVC_SCHEDULER", "legacy")
    no_ttsvc_env.delenv("TTSVC_WORKERS")
    no_ttsvc_env.delenv("TTSVC_COMPUTE_THREADS")
    assert split() == (8, 1)


@pytest.mark.parametrize(
    "flags",
    [["--workers", "0"], ["--compute-threads", "0"], ["--cpus", "0"], ["--workers", "257"],
     ["--realtime-load", "0"]],
)
def test_bad_split_is_refused(flags: list[str], tmp_path: Path) -> None:
    result = _ttsvc("serve", *flags, cwd=tmp_path)
    assert result.returncode == 2
    assert "invalid settings" in result.stderr and "Traceback" not in result.stderr
