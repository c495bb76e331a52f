"""Helpers shared by the benchmark scripts (``engine_bench``, ``http_bench``, ``swap_bench``).

Why this exists: the scripts must describe the machine, read the corpus, format and store their
numbers, and (for the HTTP ones) run ``ttsvc serve`` in exactly the same way, or their results
stop being comparable with each other. Keeping one copy here means a fix (a readiness race, a
NaN that breaks strict JSON) lands in every benchmark at once.

The scripts run as ``python benchmarks/<name>.py``, so ``benchmarks/`` is ``sys.path[0]`` and
they import this module as ``bench_common``. It is not a test helper and not part of the package.
"""

from __future__ import annotations

import math
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_CORPUS = HERE / "corpus.txt"
DEFAULT_ENGINES = HERE / ".cache" / "engines"
SERVER_LOG_DIR = HERE / ".cache"
"""Server stdout/stderr go to a file here: a pipe nobody reads would block the server."""

HOST = "127.0.0.1"
"""Loopback only: the benchmarks must never expose or reach anything off this machine."""

MIN_CHARS, MAX_CHARS = 20, 60
"""Corpus line length bounds: short voice-bot / phone-menu prompts (the issues' 20-60-character
texts), one sentence each; every target the benchmarks check assumes this workload."""

WAV_HEADER_BYTES = 44
"""The streamed response starts with a 44-byte WAV header; audio is what comes after it."""

STOP_TIMEOUT_S = 45.0
"""How long a SIGTERMed server gets to drain and exit before it is killed."""


# --------------------------------------------------------------------------- inputs and machine


def relative(path: Path) -> str:
    """Paths in results are repository-relative so no machine's layout is committed."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return Path(path).name


def load_corpus(path: Path) -> list[str]:
    """Read one prompt per line; the length bounds keep the workload what the targets assume.

    A line out of bounds, or an empty corpus, stops the run with the offending line named.
    """
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    lines = [line for line in lines if line]
    for number, line in enumerate(lines, start=1):
        if not MIN_CHARS <= len(line) <= MAX_CHARS:
            raise SystemExit(
                f"{path}:{number}: {len(line)} characters, want {MIN_CHARS}-{MAX_CHARS}: {line!r}"
            )
    if not lines:
        raise SystemExit(f"{path}: no prompts")
    return lines


def cpu_model() -> str:
    """``platform.processor()`` is often empty on Linux; /proc/cpuinfo names the CPU."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return ""


def machine_info(versions: Mapping[str, str], *, with_cpu_model: bool = True) -> dict[str, Any]:
    """What the numbers depend on; printed as the header and stored in the JSON.

    ``versions`` are the library versions the caller depends on, in the order its JSON lists
    them (each script passes its own, so this module does not import ONNX Runtime).
    ``with_cpu_model=False`` leaves out ``cpu_model`` for results whose schema never had it.
    """
    info: dict[str, Any] = {"processor": platform.processor()}
    if with_cpu_model:
        info["cpu_model"] = cpu_model()
    info.update(
        {
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        }
    )
    info.update(versions)
    return info


def utc_timestamp() -> str:
    """The run's date as stored in the JSON: UTC, ISO 8601, whole seconds."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# --------------------------------------------------------------------------- statistics, output


def pct(values: Sequence[float], q: float) -> float | None:
    """Percentile with numpy's linear interpolation; None where there are no values."""
    if not values:
        return None
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def fmt(value: float | None, digits: int = 1) -> str:
    """A table cell: fixed digits, or an en dash where there is no value."""
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value:.{digits}f}"


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None where either is missing or b is zero."""
    if a is None or b is None or b == 0:
        return None
    return a / b


def clean(value: Any) -> Any:
    """NaN and infinities to None, recursively: the JSON must be strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean(v) for v in value]
    return value


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through ``<path>.tmp`` and a rename (results/*.tmp is
    git-ignored), so an interrupted run never leaves a half-written result behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


# --------------------------------------------------------------------------- server process


def free_port() -> int:
    """A loopback port the OS says is free now (the server binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, lines: int = 20) -> str:
    """The end of a server log, for an error message when the server does not come up."""
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class Server:
    """A ``ttsvc serve`` subprocess on loopback, started exactly as an operator would run it
    (CLI, gateway + worker processes), with its output in ``log_path``.

    ``extra_args`` are appended to the command line (``--no-multiplex`` and the like); ``env``
    entries are added to this process's environment (an engine cache dir, say). ``workers=None``
    leaves ``--workers`` out, so the service picks its own split of the machine. What "ready"
    means differs between benchmarks, so ``wait_ready`` takes the check as an argument.
    """

    def __init__(
        self,
        engines_dir: Path,
        workers: int | None,
        log_path: Path,
        *,
        port: int = 0,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.port = port or free_port()
        self.workers = workers
        self.log_path = log_path
        self.argv = [
            sys.executable, "-m", "ttsvc.cli", "serve",
            "--host", HOST, "--port", str(self.port),
            *([] if workers is None else ["--workers", str(workers)]),
            "--engines-dir", str(engines_dir), *extra_args,
        ]  # fmt: skip
        full_env = None if env is None else {**os.environ, **env}
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("wb") as log_file:
            self.proc: subprocess.Popen[bytes] = subprocess.Popen(
                self.argv, stdout=log_file, stderr=subprocess.STDOUT, cwd=ROOT, env=full_env
            )

    @property
    def base_url(self) -> str:
        """Loopback URL of the gateway."""
        return f"http://{HOST}:{self.port}"

    def worker_pids(self) -> list[int] | None:
        """Spawned worker processes (not multiprocessing's resource tracker), from /proc; None
        where /proc cannot say."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        try:
            pids = []
            for pid in children.read_text().split():
                if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    pids.append(int(pid))
            return pids
        except OSError:
            return None

    def worker_count(self) -> int | None:
        """Spawned worker processes, from /proc (None where /proc cannot say)."""
        pids = self.worker_pids()
        return None if pids is None else len(pids)

    def wait_ready(
        self,
        is_ready: Callable[[httpx.Client], bool],
        *,
        timeout_s: float,
        poll_timeout_s: float,
        interval_s: float,
    ) -> float:
        """Call ``is_ready`` (a client on ``base_url``) until it says yes; returns seconds waited.

        Each poll has a short socket timeout (``poll_timeout_s``) so a half-started server cannot
        hang the loop. Between polls the wait is ``proc.wait(timeout=interval_s)`` rather than a
        sleep, so a server that crashes during start-up is noticed at once instead of after the
        deadline.
        """
        started = time.perf_counter()
        deadline = started + timeout_s
        with httpx.Client(base_url=self.base_url, timeout=poll_timeout_s, trust_env=False) as c:
            while time.perf_counter() < deadline:
                try:
                    if is_ready(c):
                        return time.perf_counter() - started
                except (httpx.HTTPError, ValueError):
                    pass
                try:
                    code = self.proc.wait(timeout=interval_s)
                except subprocess.TimeoutExpired:
                    continue
                raise RuntimeError(
                    f"server exited with {code} before it was ready; log "
                    f"{relative(self.log_path)}:\n{log_tail(self.log_path)}"
                )
        raise RuntimeError(
            f"server not ready after {timeout_s:.0f} s; log {relative(self.log_path)}:"
            f"\n{log_tail(self.log_path)}"
        )

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM (the service drains and exits 0); kill only if it does not exit in time.

        Returns the exit code, or None if even the killed process did not go away.
        """
        proc = self.proc
        if proc.poll() is not None:
            return proc.returncode
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            print(f"  server did not exit within {timeout_s:.0f} s: killing", file=sys.stderr)
            proc.kill()
            try:
                return proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                return None
