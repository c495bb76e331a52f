"""The service's log through a real pipe, as a container runtime collects it: the gateway and
two workers write to the same pipe at once, and every line read must be one JSON object."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.gateway.serving import Server
from ttsvc.repository.layout import EngineVersion

SENTENCES = ("Turn left at the next light.", "Your table is ready.", "It is ten past four.",
             "The meeting moved to Friday.")  # fmt: skip
REQUESTS = 48


@pytest.fixture(scope="module")
def piped(default_version: EngineVersion, engines_root: Path) -> Iterator[Server]:
    # unbuffered, as the image runs it (Dockerfile): a print is then a write of its own
    env = {"TTSVC_LOG_FORMAT": "json", "PYTHONUNBUFFERED": "1"}
    srv = Server(engines_root, "--workers", "2", env=env, pipe=True)
    try:
        srv.wait_ready(workers=2)
        yield srv
    finally:
        srv.stop()


def test_every_line_through_a_pipe_is_one_json_object(piped: Server) -> None:
    def ask(n: int) -> int:
        body = {"text": SENTENCES[n % len(SENTENCES)], "format": "pcm"}
        if n % 6 == 5:
            # a refusal logs from the gateway alone
            body = {"text": "", "format": "pcm", "empty_text": "error"}
        with httpx.stream("POST", f"{piped.url}/synthesize", json=body, timeout=120) as r:
            r.read()
            return r.status_code

    with ThreadPoolExecutor(16) as pool:
        codes = list(pool.map(ask, range(REQUESTS)))
    piped.wait_idle()
    piped.stop(keep_log=True)  # every process that held the pipe is gone: all of it copied
    lines = [line for line in piped.log_lines() if line.strip()]
    broken = []
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            broken.append(line)
    assert not broken, broken[:3]
    assert all(isinstance(e, dict) for e in events)
    done = [e for e in events if e.get("event") == "request"]
    assert sorted(int(e["code"]) for e in done) == sorted(codes)
    served = sum(1 for code in codes if code == 200)
    assert served == REQUESTS - REQUESTS // 6
    assert sum(1 for e in events if e.get("event") == "stream_done") == served
