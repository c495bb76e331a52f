"""The gateway's edges on a real `ttsvc serve` (real workers, the real voice): the address it
binds by default, the error shape of requests the routes never see (bad JSON, unknown routes),
the documentation switch, and the cap on the audio one request may produce."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.serving import Server, wait_until
from ttsvc.cpus import cpu_budget
from ttsvc.repository.layout import EngineVersion

MAX_AUDIO_S = 20.0
WORKER_MEMORY_MB = 1536


@pytest.fixture(scope="module")
def server(default_version: EngineVersion, engines_root: Path) -> Iterator[Server]:
    srv = Server(engines_root, "--workers", "1", "--no-api-docs", "--max-audio-s",
                 str(MAX_AUDIO_S), "--worker-memory-mb", str(WORKER_MEMORY_MB),
                 host=None)  # fmt: skip
    srv.wait_ready(1)
    yield srv
    srv.stop()


def listening(port: int) -> set[str]:
    """Local addresses of the TCP sockets listening on ``port`` (from /proc/net/tcp{,6})."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


def test_a_bare_serve_listens_on_loopback_only(server: Server) -> None:
    assert listening(server.port) == {"0100007F"}  # 127.0.0.1, little-endian hex
    assert listening(server.metrics_port) == {"0100007F"}


def test_start_up_line_says_processes_x_threads_and_where_the_cpus_came_from(
    server: Server,
) -> None:
    (line,) = [json.loads(x) for x in server.log_lines() if '"event": "serving"' in x]
    budget = cpu_budget()  # the server's cgroup and affinity mask are this test's
    # --workers 1 and no --compute-threads: the CPUs all go to the one process
    assert (line["workers"], line["compute_threads"]) == (1, budget.cpus)
    assert line["split"] == f"1x{budget.cpus}"
    assert (line["cpus"], line["cpus_from"]) == (budget.cpus, budget.source)


def _proc(pid: int, name: str) -> str:
    return Path(f"/proc/{pid}/{name}").read_text()


def test_a_worker_caps_its_memory_and_goes_first_to_the_oom_killer(server: Server) -> None:
    """Before: no worker had a cap of its own, and all ranked with the gateway, so a runaway
    worker got the whole pod (gateway included) OOM-killed."""
    (worker,) = server.worker_pids()
    limit = next(line for line in _proc(worker, "limits").splitlines()
                 if line.startswith("Max data size"))  # fmt: skip
    assert limit.split()[3:5] == [str(WORKER_MEMORY_MB << 20)] * 2  # soft and hard
    gateway = int(_proc(server.proc.pid, "oom_score_adj"))
    assert int(_proc(worker, "oom_score_adj")) == min(1000, gateway + 500)
    assert "unlimited" in next(line for line in _proc(server.proc.pid, "limits").splitlines()
                               if line.startswith("Max data size"))  # fmt: skip


def completions(server: Server, status: str) -> list[dict[str, object]]:
    lines = [json.loads(x) for x in server.log_lines() if '"event": "request"' in x]
    return [x for x in lines if x.get("status") == status]


def counted(server: Server, code: int, outcome: str) -> float:
    text = httpx.get(server.metrics_url, timeout=10).text
    found = re.search(rf'ttsvc_requests_total{{code="{code}",outcome="{outcome}"}} (\S+)', text)
    return float(found.group(1)) if found else 0.0


@pytest.mark.parametrize(
    "body",
    [b'{"text": "hi",', b'{"text": "hi"} trailing', b'{"text": "\xff\xfe"}'],
    ids=["cut", "trailing", "not-utf8"],
)
def test_a_body_that_is_not_json_gets_400_a_line_and_a_count(server: Server, body: bytes) -> None:
    before = counted(server, 400, "invalid_json")
    lines = len(completions(server, "invalid_json"))
    r = server.client.post("/synthesize", content=body,
                           headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 400, r.text
    assert r.json().keys() == {"error", "type", "field"}
    assert r.json()["type"] == "invalid_json" and r.json()["field"] == "body"
    assert r.headers["x-request-id"]
    assert counted(server, 400, "invalid_json") == before + 1
    assert len(completions(server, "invalid_json")) == lines + 1
    openai = server.client.post("/v1/audio/speech", content=body,
                                headers={"content-type": "application/json"})  # fmt: skip
    assert openai.status_code == 400
    assert openai.json()["error"]["type"] == "invalid_json"
    assert openai.json()["error"]["message"]


def test_an_upload_cut_mid_body_counts_as_the_client_leaving(server: Server) -> None:
    """Before: counted as a 400 ``invalid_json`` (the body read failed), as if the client had
    sent a bad body."""
    before = counted(server, 499, "cancelled")
    lines = len(completions(server, "cancelled"))
    invalid = len(completions(server, "invalid_json"))
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"POST /synthesize HTTP/1.1\r\nHost: ttsvc\r\nContent-Type: "
                     b"application/json\r\nContent-Length: 200\r\n\r\n{\"text\": \"Half a")
    wait_until(server, lambda: len(completions(server, "cancelled")), lambda n: n > lines,
               "the cut upload's completion line")  # fmt: skip
    (line,) = completions(server, "cancelled")[lines:]
    assert line["code"] == 499 and line["text_len"] is None
    assert counted(server, 499, "cancelled") == before + 1
    assert len(completions(server, "invalid_json")) == invalid


def test_unknown_routes_and_methods_get_the_error_shape(server: Server) -> None:
    lines = len(completions(server, "method_not_allowed"))
    missing = server.client.get("/nothing/here")
    assert missing.status_code == 404
    assert missing.json() == {"error": "no such route", "type": "not_found"}
    v1 = server.client.get("/v1/nothing")
    assert v1.status_code == 404 and v1.json()["error"]["type"] == "not_found"
    wrong = server.client.get("/synthesize")
    assert wrong.status_code == 405 and wrong.json()["type"] == "method_not_allowed"
    assert wrong.headers["allow"] == "POST"
    assert len(completions(server, "method_not_allowed")) == lines + 1  # a synthesis route
    assert counted(server, 405, "method_not_allowed") >= 1


def test_documentation_can_be_turned_off(server: Server) -> None:
    for path in ("/docs", "/redoc", "/openapi.json"):
        r = server.client.get(path)
        assert r.status_code == 404 and r.json()["type"] == "not_found"


DIGITS = "1234567890 " * 30
"""Numbers read out in words: about 160 s of audio from 330 characters."""


@pytest.mark.parametrize("stream", [True, False])
def test_text_that_would_exceed_the_audio_cap_gets_422_before_any_audio(
    server: Server, stream: bool
) -> None:
    r = server.synth(DIGITS, stream=stream)
    assert r.status_code == 422, r.status_code
    assert r.json()["type"] == "audio_too_long" and r.json()["field"] == "text"
    assert f"{MAX_AUDIO_S:g} s" in r.json()["error"]
    speech = server.client.post("/v1/audio/speech", json={"model": "tts-1", "voice": "alloy",
                                                          "input": DIGITS, "stream": stream})
    assert speech.status_code == 422
    assert speech.json()["error"]["type"] == "audio_too_long"
    assert speech.json()["error"]["param"] == "input"
    lines = completions(server, "audio_too_long")
    assert lines and all(x["code"] == 422 and x["audio_s"] == 0.0 for x in lines)
    assert server.synth("A short answer still fits.").status_code == 200


def test_short_sentences_past_the_cap_are_refused_before_any_audio(server: Server) -> None:
    """Short sentences make more audio per phoneme than prose (each carries its own pauses):
    the estimate's margin covers them, so the answer is a clean 422, not a stream cut at the
    cap (the stop before each sentence is the backstop, tested in
    ``tests/synthesis/test_synthesizer.py``)."""
    for stream in (True, False):
        r = server.synth("Yes. " * 30, stream=stream)
        assert r.status_code == 422, r.status_code
        assert r.json()["type"] == "audio_too_long"
        assert "would make about" in r.json()["error"]  # the estimate, before any audio
