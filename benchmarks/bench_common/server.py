"""A server under test as a subprocess on loopback: ``ttsvc serve``, or any other command.

Why this exists: every HTTP benchmark starts, waits for and stops its servers; doing it one
way means a fix (a readiness race, a server that crashed during start-up noticed at once, a
pipe nobody reads blocking the server) lands in all of them. ``Server`` is ``ttsvc serve``
started exactly as an operator would run it; ``ServerProcess`` is any command (Piper's HTTP
server, the load-per-request baseline) with the same start, readiness and stop.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import httpx

from bench_common.context import ROOT, relative

HOST = "127.0.0.1"
"""Loopback only: the benchmarks must never expose or reach anything off this machine."""

STOP_TIMEOUT_S = 45.0
"""How long a SIGTERMed server gets to drain and exit before it is killed."""


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


def serve_argv(
    engines_dir: Path, workers: int | None, port: int, extra_args: Sequence[str] = ()
) -> list[str]:
    """The ``ttsvc serve`` command line on loopback (``workers=None`` leaves ``--workers`` out,
    so the service picks its own split of the machine)."""
    return [
        sys.executable, "-m", "ttsvc.cli", "serve",
        "--host", HOST, "--port", str(port),
        *([] if workers is None else ["--workers", str(workers)]),
        "--engines-dir", str(engines_dir), *extra_args,
    ]  # fmt: skip


class ServerProcess:
    """Any server command, started with its output in ``log_path``.

    ``env`` entries are added to this process's environment; ``cwd`` is where it runs (None:
    this process's directory). What "ready" means differs between benchmarks, so
    ``wait_ready`` takes the check as an argument.
    """

    def __init__(
        self,
        argv: Sequence[str],
        log_path: Path,
        *,
        port: int,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        pipe: bool = False,
    ) -> None:
        """``pipe``: the output goes through a real pipe that a thread copies to ``log_path``
        (``serve 2>&1 | cat > log``: how a container runtime collects it) rather than
        straight into the file."""
        self.argv = list(argv)
        self.port = port
        self.log_path = log_path
        full_env = None if env is None else {**os.environ, **env}
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._copier: threading.Thread | None = None
        with log_path.open("wb") as log_file:
            self.proc: subprocess.Popen[bytes] = subprocess.Popen(
                self.argv, stdout=subprocess.PIPE if pipe else log_file,
                stderr=subprocess.STDOUT, cwd=cwd, env=full_env,
            )  # fmt: skip
        if pipe:
            self._copier = threading.Thread(target=self._copy, name="log-copy", daemon=True)
            self._copier.start()

    def _copy(self) -> None:
        """The pipe's bytes to the log file in the pieces the pipe gives (as ``cat`` does)."""
        assert self.proc.stdout is not None
        with self.log_path.open("ab", buffering=0) as out:
            while data := os.read(self.proc.stdout.fileno(), 65536):
                out.write(data)

    @property
    def base_url(self) -> str:
        """Loopback URL of the server."""
        return f"http://{HOST}:{self.port}"

    def wait_ready(
        self,
        is_ready: Callable[[httpx.Client], bool],
        *,
        timeout_s: float,
        poll_timeout_s: float,
        interval_s: float,
        name: str | None = None,
    ) -> float:
        """Call ``is_ready`` (a client on ``base_url``) until it says yes; returns seconds waited.

        Each poll has a short socket timeout (``poll_timeout_s``) so a half-started server cannot
        hang the loop. Between polls the wait is ``proc.wait(timeout=interval_s)`` rather than a
        sleep, so a server that crashes during start-up is noticed at once instead of after the
        deadline. ``name`` words the errors as the comparison benchmark always has
        (``<name> exited with <code>``); without it they name the log.
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
                if name is not None:
                    raise RuntimeError(f"{name} exited with {code}:\n{log_tail(self.log_path)}")
                raise RuntimeError(
                    f"server exited with {code} before it was ready; log "
                    f"{relative(self.log_path)}:\n{log_tail(self.log_path)}"
                )
        if name is not None:
            raise RuntimeError(f"{name} not ready in {timeout_s:.0f} s")
        raise RuntimeError(
            f"server not ready after {timeout_s:.0f} s; log {relative(self.log_path)}:"
            f"\n{log_tail(self.log_path)}"
        )

    def stop(self, timeout_s: float = STOP_TIMEOUT_S, *, announce_kill: bool = True) -> int | None:
        """SIGTERM (ttsvc drains and exits 0); kill only if it does not exit in time.

        Returns the exit code, or None if even the killed process did not go away.
        ``announce_kill`` says so on stderr when the kill is needed.
        """
        code = self._stop(timeout_s, announce_kill)
        if self._copier is not None:
            self._copier.join(timeout=10)  # the pipe's end, once every process holding it exits
        return code

    def _stop(self, timeout_s: float, announce_kill: bool) -> int | None:
        proc = self.proc
        if proc.poll() is not None:
            return proc.returncode
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            if announce_kill:
                print(f"  server did not exit within {timeout_s:.0f} s: killing", file=sys.stderr)
            proc.kill()
            try:
                return proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                return None


class Server(ServerProcess):
    """A ``ttsvc serve`` subprocess on loopback, started exactly as an operator would run it
    (CLI, gateway + worker processes), from the repository root, with its output in
    ``log_path``.

    ``extra_args`` are appended to the command line (``--compute-threads 1`` and the like); ``env``
    entries are added to this process's environment (an engine cache dir, say). ``workers=None``
    leaves ``--workers`` out, so the service picks its own split of the machine.
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
        pipe: bool = False,
    ) -> None:
        port = port or free_port()
        self.workers = workers
        argv = serve_argv(engines_dir, workers, port, extra_args)
        super().__init__(argv, log_path, port=port, env=env, cwd=ROOT, pipe=pipe)

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
