"""A real `ttsvc serve` subprocess on 127.0.0.1 for the gateway tests."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ttsvc.gateway.core.keys import append_key, key_line, new_key
from ttsvc.gateway.core.quotas import Quota

T = TypeVar("T")
QUEUE_WHEN_FULL = {"TTSVC_OVERLOAD": "queue"}
"""The servers of tests not about admission hold a stream a full worker cannot take yet rather
than refuse it (429 ``no_headroom``, the service's default): this suite's machine is shared, a
worker's live capacity reads lower while the other xdist worker compiles, and a test of swaps
or voices must not depend on it. The admission tests pass ``TTSVC_OVERLOAD=refuse``."""
HEALTH_POLLS = 600  # bounded wait for READY: each poll blocks up to 0.1 s on the socket


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A `ttsvc serve` subprocess and a client for it (``host=None``: the service's default
    address, which is loopback too)."""

    def __init__(
        self,
        engines: Path,
        *args: str,
        env: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        host: str | None = "127.0.0.1",
        metrics_port: bool = True,
        pipe: bool = False,
    ) -> None:
        """``metrics_port=False``: leave the metrics port to the service's default. ``pipe``:
        the server's output goes through a real pipe (as a container runtime collects it),
        which a thread copies, byte for byte, to the log file the other methods read."""
        self.port = _free_port()
        self.log = tempfile.TemporaryFile("w+")  # noqa: SIM115 - open as long as the server
        # the server writes through the same open file: with O_APPEND its lines always go to
        # the end, even while ``log_lines`` has moved the shared offset back to read them
        flags = fcntl.fcntl(self.log.fileno(), fcntl.F_GETFL)
        fcntl.fcntl(self.log.fileno(), fcntl.F_SETFL, flags | os.O_APPEND)
        self.url = f"http://127.0.0.1:{self.port}"
        self.metrics_port = _free_port()
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        metrics = ["--metrics-port", str(self.metrics_port)] if metrics_port else []
        environ = {k: v for k, v in os.environ.items() if metrics_port or k != "TTSVC_METRICS_PORT"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ttsvc.cli", "serve", *(["--host", host] if host else []),
             "--port", str(self.port), *metrics, "--engines-dir", str(engines), *args],
            stdout=subprocess.PIPE if pipe else self.log, stderr=subprocess.STDOUT,
            env={**QUEUE_WHEN_FULL, **environ, **(env or {})},
        )  # fmt: skip
        self._copier: threading.Thread | None = None
        if pipe:
            self._copier = threading.Thread(target=self._copy, name="server-log", daemon=True)
            self._copier.start()
        self.headers = headers or {}
        """Sent with every request of ``client`` (an API key, for a server that needs one)."""
        self.client = httpx.Client(base_url=self.url, timeout=60, headers=self.headers)

    def _copy(self) -> None:
        """The pipe's bytes to the log file as they come, in the pieces the pipe gives."""
        assert self.proc.stdout is not None
        out = self.log.fileno()
        while data := os.read(self.proc.stdout.fileno(), 65536):
            os.write(out, data)

    def wait_ready(self, workers: int) -> None:
        for _ in range(HEALTH_POLLS):
            assert self.proc.poll() is None, f"server exited: {self.log_tail()}"
            try:
                r = httpx.get(f"{self.url}/voices", timeout=0.1, headers=self.headers)
                if r.status_code == 200 and len(self.ready_pids()) == workers:
                    if self.client.get("/health").status_code == 200:
                        return
            except httpx.TransportError:
                pass
            try:  # block on the child for a moment instead of sleeping
                self.proc.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                pass
        raise AssertionError("server never became ready")

    def log_lines(self) -> list[str]:
        """Everything the server wrote so far."""
        self.log.flush()
        self.log.seek(0)
        return self.log.read().splitlines()

    def log_tail(self, n: int = 15) -> str:
        return "\n".join(self.log_lines()[-n:])

    def wait_idle(self) -> None:
        """Wait until the gateway reports no request in flight (bounded number of probes)."""
        for _ in range(HEALTH_POLLS):
            if self.client.get("/health").json().get("inflight") == 0:
                return
        raise AssertionError("requests stayed in flight")

    def events(self) -> list[dict[str, object]]:
        """The JSON log lines so far (gateway and workers)."""
        return [json.loads(line) for line in self.log_lines() if line.startswith("{")]

    def completions(self) -> list[dict[str, object]]:
        """The requests' completion log lines so far (one per synthesis request)."""
        return [e for e in self.events() if e.get("event") == "request"]

    def worker_pids(self) -> list[int]:
        """Spawned worker processes (not multiprocessing's resource tracker)."""
        pids = []
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        for pid in children.read_text().split():
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            if b"spawn_main" in cmdline:
                pids.append(int(pid))
        return pids

    def ready_pids(self) -> list[int]:
        return self.worker_pids()

    def synth(self, text: str, **kw: object) -> httpx.Response:
        return self.client.post("/synthesize", json={"text": text, **kw})

    def stop(self, keep_log: bool = False) -> None:
        """SIGTERM and wait; ``keep_log``: the log stays readable (closed with the object)."""
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._copier is not None:
            self._copier.join(timeout=60)  # the pipe's end: every process that held it is gone
        if not keep_log:
            self.log.close()


def engines_state(server: Server) -> dict[str, object]:
    """The serving engine label, reload counts and last error, from ``GET /voices``."""
    engines = server.client.get("/voices").json()["voices"][0]["engines"]
    assert isinstance(engines, dict)
    return engines


def wait_until(server: Server, probe: Callable[[], T], predicate: Callable[[T], bool],
               what: str) -> T:  # fmt: skip
    """Call ``probe`` until ``predicate`` holds for what it returns (a bounded number of
    probes, blocking on the server process between them: it must not exit meanwhile)."""
    for _ in range(HEALTH_POLLS * 2):
        found = probe()
        if predicate(found):
            return found
        try:  # block on the server process briefly instead of sleeping
            server.proc.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            pass
        else:
            raise AssertionError(f"server exited while waiting for: {what}: {server.log_tail()}")
    raise AssertionError(f"never saw: {what}; last {probe()}")


def wait_engines(server: Server, predicate: object, what: str) -> dict[str, object]:
    """Probe ``/voices`` until ``predicate(state)`` holds (a bounded number of HTTP probes)."""
    assert callable(predicate)
    return wait_until(server, lambda: engines_state(server), predicate, what)


def voices(server: Server) -> dict[str, dict[str, object]]:
    """``GET /voices`` by name."""
    return {v["name"]: v for v in server.client.get("/voices").json()["voices"]}


def wait_voices(server: Server, predicate: object, what: str) -> dict[str, dict[str, object]]:
    """Probe ``GET /voices`` until ``predicate`` holds (a bounded number of HTTP probes)."""
    assert callable(predicate)
    return wait_until(server, lambda: voices(server), predicate, what)


def write_keys(path: Path, quotas: dict[str, dict[str, float]]) -> dict[str, str]:
    """A key file with a fresh key per name (``{"rpm": 3}``-style limits); name → key."""
    keys = {}
    for name, limits in quotas.items():
        keys[name] = new_key()
        rpm, streams = limits.get("rpm"), limits.get("streams")
        quota = Quota(None if rpm is None else int(rpm), limits.get("audio_s_per_min"),
                      None if streams is None else int(streams))  # fmt: skip
        append_key(path, key_line(name, keys[name], quota))
    return keys


@contextlib.contextmanager
def keyed_server(engines_root: Path, key_file: Path, key: str, *args: str) -> Iterator[Server]:
    """A one-worker ``ttsvc serve`` with API keys on (``key_file``) whose client sends ``key``
    (``args``: more flags), ready when entered and stopped on exit."""
    srv = Server(engines_root, "--workers", "1", "--api-keys-file", str(key_file), *args,
                 headers=bearer(key))  # fmt: skip
    try:
        srv.wait_ready(1)
        yield srv
    finally:
        srv.stop()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def metric(server: Server, name: str, **labels: str) -> float:
    """The value of one sample of the server's metrics (0 when it has none yet)."""
    text = httpx.get(server.metrics_url, timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0
