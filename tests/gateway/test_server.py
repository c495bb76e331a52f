"""A real `ttsvc serve` on 127.0.0.1 with real worker processes and the real voice."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import select
import signal
import socket
import threading
import wave
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.gateway.serving import Server
from ttsvc.config import Settings
from ttsvc.repository.layout import EngineVersion
from ttsvc.synthesis import SynthesisParams, Synthesizer


@pytest.fixture(scope="module")
def server(default_version: EngineVersion, engines_root: Path) -> Iterator[Server]:
    srv = Server(engines_root, "--workers", "2")
    srv.wait_ready(2)
    yield srv
    srv.stop()


DET = {"noise_scale": 0.0, "noise_w": 0.0}


def _pcm(response: httpx.Response) -> np.ndarray:  # type: ignore[type-arg]
    assert response.status_code == 200, response.text
    return np.frombuffer(response.content[44:], dtype="<i2")


def test_streamed_bytes_equal_one_shot(server: Server, synth: Synthesizer) -> None:
    text = "Streaming must not change a single sample. Really!"
    streamed = server.synth(text, **DET)
    assert streamed.headers["x-engine-version"] == "1"
    assert streamed.headers["x-sample-rate"] == "22050"
    assert streamed.headers["x-accel-buffering"] == "no"
    assert streamed.headers["x-request-id"]
    whole = server.synth(text, stream=False, **DET)
    assert whole.content[:4] == b"RIFF"
    expected = synth.synthesize(text, SynthesisParams(noise_scale=0.0, noise_w=0.0))
    got = _pcm(streamed)
    assert got.shape == expected.shape == _pcm(whole).shape
    assert np.max(np.abs(got.astype(np.int32) - expected)) <= 33  # 1e-3 of full scale


def test_concurrent_requests_have_no_cross_talk(server: Server) -> None:
    texts = [f"Caller number {n} is asking about order {n}{n}." for n in
             ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine")]  # fmt: skip
    baseline = {t: _pcm(server.synth(t, **DET)) for t in texts}
    results: dict[str, np.ndarray] = {}  # type: ignore[type-arg]

    def call(text: str) -> None:
        with httpx.Client(base_url=server.url, timeout=120) as c:
            results[text] = _pcm(c.post("/synthesize", json={"text": text, **DET}))

    threads = [threading.Thread(target=call, args=(t,)) for t in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for text in texts:
        # each worker sizes its windows by its own measured speed, and windows agree with one-shot
        # to ~1e-6, so a sample may round one PCM16 step apart; another caller's audio would not
        assert results[text].shape == baseline[text].shape, text
        diff = np.abs(results[text].astype(np.int32) - baseline[text])
        assert diff.max() <= 1, text


@pytest.mark.parametrize(
    "body,status,err_type,field",
    [
        ({"text": "hi", "speed": 9}, 422, "invalid_parameter", "speed"),
        ({"text": "hi", "noise_w": -1}, 422, "invalid_parameter", "noise_w"),
        ({"text": "hi", "format": "ogg"}, 422, "invalid_parameter", "format"),
        ({"text": "hi", "bogus": 1}, 422, "invalid_parameter", "bogus"),
        ({"speed": 1}, 422, "invalid_parameter", "text"),
        ({"text": "   ", "empty_text": "error"}, 422, "empty_text", "text"),
        ({"text": "🎉🎉", "empty_text": "error"}, 422, "empty_text", "text"),
        ({"text": "🎉🎉", "empty_text": "no"}, 422, "invalid_parameter", "empty_text"),
        ({"text": "a" * 4097}, 422, "text_too_long", "text"),
        ({"text": "hi", "voice": "nobody"}, 404, "unknown_voice", "voice"),
        ({"text": "hi", "sample_rate": 12345}, 422, "invalid_parameter", "sample_rate"),
        ({"text": "hi", "stream": "maybe"}, 422, "invalid_parameter", "stream"),
    ],
)
def test_invalid_input_gets_documented_4xx(
    server: Server, body: dict[str, object], status: int, err_type: str, field: str
) -> None:
    r = server.client.post("/synthesize", json=body)
    assert r.status_code == status, r.text
    data = r.json()
    assert data["type"] == err_type and data["error"]
    assert data.get("field") == field
    # the id of its completion line, also for a refusal a worker made (before: an emoji's 422
    # had none)
    assert r.headers["x-request-id"]


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_a_speed_that_is_not_a_number_is_named_as_such(server: Server, value: str) -> None:
    """Python's JSON parser takes NaN and Infinity; before, NaN was told it must be <= 4."""
    r = server.client.post("/synthesize", content=f'{{"text": "hi", "speed": {value}}}',
                           headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 422 and r.json()["field"] == "speed"
    assert r.json()["error"] == "speed: Input should be a finite number"


def _error_lines(server: Server) -> list[str]:
    """``error_type`` of each completion line the server logged so far."""
    found = []
    for line in server.log_lines():
        if '"event": "request"' in line:
            found.append(str(json.loads(line).get("error_type")))
    return found


def test_oversized_body_is_413(server: Server) -> None:
    before = len(_error_lines(server))
    r = server.client.post("/synthesize", content=b'{"text": "' + b"a" * 70000 + b'"}',
                           headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 413 and r.json()["type"] == "payload_too_large"

    def chunked() -> Iterator[bytes]:  # no Content-Length: the cap must count bytes itself
        yield b'{"text": "'
        for _ in range(70):
            yield b"a" * 1024
        yield b'"}'

    r = server.client.post("/synthesize", content=chunked(),
                           headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 413 and r.json()["type"] == "payload_too_large"
    # each refusal is one completion line: the app's failed read after the cap records nothing
    assert _error_lines(server)[before:] == ["payload_too_large", "payload_too_large"]


def test_health_live_voices(server: Server) -> None:
    health = server.client.get("/health").json()
    assert health["status"] == "ok" and 0 <= health["score"] <= 100
    assert server.client.get("/live").json() == {"status": "ok"}
    voice = server.client.get("/voices").json()["voices"][0]
    assert voice["name"] == "en_US-joe-medium" and voice["state"] == "serving"
    assert voice["language"] == {"code": "en_US", "name": "English", "espeak_voice": "en-us"}
    assert voice["sample_rate"] == 22050 and voice["quality"] == "medium"
    assert voice["num_speakers"] == 1 and voice["speakers"] == []


def test_killed_worker_fails_only_its_streams_and_comes_back(
    default_version: EngineVersion, engines_root: Path
) -> None:
    srv = Server(engines_root, "--workers", "2")
    try:
        srv.wait_ready(2)
        long_text = "This is a long answer that keeps a worker busy for a while. " * 6
        full_size = 44 + 2 * len(_pcm(srv.synth(long_text, **DET)))
        for _round in range(
            3
        ):  # the balancer decides where streams go: retry if one worker got all
            complete, short = _kill_one_worker_under_four_streams(srv, long_text, full_size)
            assert len(complete) + len(short) == 4
            if complete and short:
                break
            srv.wait_ready(2)
        # streams on the killed worker ended short; the others finished whole
        assert complete and short
        srv.wait_ready(2)  # respawned and READY again
        assert srv.synth("Back in service.").status_code == 200
    finally:
        srv.stop()


def _kill_one_worker_under_four_streams(
    srv: Server, long_text: str, full_size: int
) -> tuple[list[int], list[int]]:
    sizes: dict[int, int] = {}
    started = threading.Barrier(5)

    def call(i: int) -> None:
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            with c.stream("POST", "/synthesize", json={"text": long_text, **DET}) as r:
                assert r.status_code == 200
                it = r.iter_bytes()
                size = len(next(it))
                started.wait(timeout=60)
                try:
                    size += sum(len(b) for b in it)
                except httpx.HTTPError:
                    pass  # the victim's stream may end abruptly: that is its failure mode
                sizes[i] = size

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    started.wait(timeout=60)  # every stream has audio flowing
    os.kill(srv.worker_pids()[0], signal.SIGKILL)
    for t in threads:
        t.join()
    complete = [s for s in sizes.values() if s == full_size]
    short = [s for s in sizes.values() if s < full_size]
    return complete, short


def test_sigterm_drains_in_flight_then_exits_zero(
    default_version: EngineVersion, engines_root: Path
) -> None:
    srv = Server(engines_root, "--workers", "1", "--drain-grace", "60")
    srv.wait_ready(1)
    text = "Please keep talking while the server shuts down gracefully. " * 4
    expected_len = len(_pcm(srv.synth(text, **DET)))
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        with c.stream("POST", "/synthesize", json={"text": text, **DET}) as r:
            it = r.iter_bytes()
            received = len(next(it))
            srv.proc.send_signal(signal.SIGTERM)
            with httpx.Client(base_url=srv.url, timeout=10) as probe:
                assert probe.get("/health").status_code == 503
                late = probe.post("/synthesize", json={"text": "too late"})
                assert late.status_code == 503 and late.json()["type"] == "draining"
            received += sum(len(b) for b in it)
    assert received == 44 + 2 * expected_len
    assert srv.proc.wait(timeout=60) == 0


def test_overload_gets_429_with_retry_after(
    default_version: EngineVersion, engines_root: Path
) -> None:
    srv = Server(engines_root, "--workers", "1", "--max-streams-per-worker", "1")
    try:
        srv.wait_ready(1)
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            # about two minutes of audio: far more than socket buffers hold, so the stream
            # stays in flight while the client reads slowly
            long_text = "Hold the only slot while I keep on talking. " * 60
            with c.stream("POST", "/synthesize", json={"text": long_text}) as r:
                chunks = r.iter_bytes()  # keep a reference: dropping it closes the response
                assert next(chunks)
                busy = srv.synth("No room for me.")
                assert busy.status_code == 429
                assert busy.headers["retry-after"] == "1"
                assert busy.json()["type"] == "overloaded"
                # nothing to say is known at once: its silence, not a 429 for a slot it
                # never needs
                empty = srv.synth(" \n\t ")
                assert empty.status_code == 200 and empty.headers["x-empty-text"] == "true"
                assert empty.headers["x-request-id"]
            # leaving the block disconnects mid-stream: the gateway must notice and free the slot
        srv.wait_idle()
        assert srv.synth("Room again.").status_code == 200
    finally:
        srv.stop()


@pytest.mark.parametrize("rate", [8000, 16000, 22050, 24000, 44100, 48000])
def test_output_rates_resample_the_same_speech(server: Server, rate: int) -> None:
    text = "Resampled speech keeps its length."
    native = _pcm(server.synth(text, stream=False, **DET))
    r = server.synth(text, sample_rate=rate, **DET)
    assert r.headers["x-sample-rate"] == str(rate)
    pcm = _pcm(r)
    assert abs(len(pcm) / rate - len(native) / 22050) < 0.01  # same duration within 10 ms
    assert np.sqrt(np.mean(pcm.astype(np.float64) ** 2)) > 300  # audible, not silence
    exact = server.synth(text, sample_rate=rate, stream=False, **DET)
    with wave.open(io.BytesIO(exact.content)) as w:  # an independent reader of the container
        assert w.getframerate() == rate and w.getnframes() == len(pcm)


def test_pcm_format_is_raw_samples(server: Server) -> None:
    text = "Raw samples, no header."
    wav = server.synth(text, **DET)
    raw = server.synth(text, format="pcm", **DET)
    assert raw.headers["content-type"].startswith("audio/L16")
    # the same samples, to the least bit: stateful engines' windows may be cut elsewhere when a
    # stream shares its worker (a first window of 16 frames, not 4), which moves the float sums
    samples = np.frombuffer(raw.content, "<i2").astype(np.int32)
    wav_samples = np.frombuffer(wav.content[44:], "<i2").astype(np.int32)
    assert len(samples) == len(wav_samples)
    assert np.abs(samples - wav_samples).max() <= 2


def test_hung_worker_times_out_queue_and_is_replaced(
    default_version: EngineVersion, engines_root: Path
) -> None:
    env = {
        "TTSVC_BALANCER_HEARTBEAT_TIMEOUT_S": "1",
        "TTSVC_WORKER_SILENCE_TIMEOUT_S": "3",
        "TTSVC_QUEUE_TIMEOUT_S": "1",
    }
    srv = Server(engines_root, "--workers", "1", env=env)
    try:
        srv.wait_ready(1)
        (victim,) = srv.worker_pids()
        os.kill(victim, signal.SIGSTOP)  # alive but silent: no EOF ever arrives
        r = srv.synth("Anyone there?")
        assert r.status_code == 503
        # whichever comes first: its queue deadline, or its worker's heartbeat going stale
        assert r.json()["type"] in ("queue_timeout", "no_worker_available", "worker_unresponsive")
        srv.wait_ready(1)  # the watchdog killed it and a fresh worker said READY
        assert srv.worker_pids() != [victim]
        assert srv.synth("A fresh worker answers.").status_code == 200
    finally:
        srv.stop()


def test_workers_exit_when_the_gateway_dies(
    default_version: EngineVersion, engines_root: Path
) -> None:
    srv = Server(engines_root, "--workers", "2")
    srv.wait_ready(2)
    pidfds = [os.pidfd_open(pid) for pid in srv.worker_pids()]
    srv.proc.kill()  # SIGKILL: the gateway gets no chance to stop them
    srv.proc.wait()
    try:
        for fd in pidfds:
            readable, _, _ = select.select([fd], [], [], 30)  # a pidfd turns readable on exit
            assert readable, "a worker outlived its gateway"
    finally:
        for fd in pidfds:
            os.close(fd)
        srv.client.close()


@pytest.fixture(scope="module")
def default_metrics_server(
    default_version: EngineVersion, engines_root: Path
) -> Iterator[tuple[Server, int]]:
    """A server left to the default metrics port while that port is taken (by this fixture, or
    already by something else: taken either way)."""
    default = Settings.model_fields["metrics_port"].default
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with contextlib.suppress(OSError):  # in use already: the case under test anyway
            holder.bind(("127.0.0.1", default))
            holder.listen()
        srv = Server(engines_root, "--workers", "1", metrics_port=False)
        try:
            srv.wait_ready(1)
            yield srv, default
        finally:
            srv.stop()


def test_taken_default_metrics_port_falls_back_to_a_free_one(
    default_metrics_server: tuple[Server, int],
) -> None:
    server, default = default_metrics_server
    events = [json.loads(line) for line in server.log_lines() if line.startswith("{")]
    taken = [e for e in events if e["event"] == "metrics_port_taken"]
    assert len(taken) == 1 and taken[0]["taken"] == default
    port = taken[0]["metrics_port"]
    assert port != default
    serving = next(e for e in events if e["event"] == "serving")
    assert serving["metrics_port"] == port
    scraped = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert scraped.status_code == 200 and "ttsvc_" in scraped.text
    assert not any("Traceback" in line for line in server.log_lines())


def test_api_docs_are_off_by_default(default_metrics_server: tuple[Server, int]) -> None:
    server, _ = default_metrics_server
    for path in ("/docs", "/redoc", "/openapi.json"):
        r = server.client.get(path)
        assert r.status_code == 404 and r.json()["type"] == "not_found"


def _readme_first_curl() -> tuple[str, dict[str, object]]:
    """The route and JSON body of the first ``curl`` in the README's quick start."""
    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    quick = readme.split("## Quick start", 1)[1]
    command = re.search(r"^curl .*?(?<!\\)\n", quick, re.MULTILINE | re.DOTALL)
    assert command is not None
    text = command.group(0).replace("\\\n", " ")
    route = re.search(r"localhost:\d+(/\S+)", text)
    body = re.search(r"-d '([^']*)'", text)
    assert route is not None and body is not None
    return route.group(1), json.loads(body.group(1))


def test_readme_first_curl_gives_a_wav_that_wave_reads_exactly(
    default_metrics_server: tuple[Server, int],
) -> None:
    server, _ = default_metrics_server
    route, body = _readme_first_curl()
    response = server.client.post(route, json=body)
    assert response.status_code == 200, response.text
    with wave.open(io.BytesIO(response.content)) as wav:
        frames, rate = wav.getnframes(), wav.getframerate()
        assert len(wav.readframes(frames)) == 2 * frames == len(response.content) - 44
    assert 1.0 < frames / rate < 6.0  # a short greeting, not hours


def test_a_forced_log_format_holds_for_the_workers_too(engines_root: Path) -> None:
    """``--log-format console`` into a file (JSON by default there): the workers, which write
    to the same stdout, follow the gateway's setting instead of deciding for themselves."""
    srv = Server(engines_root, "--workers", "1", "--log-format", "console")
    try:
        srv.wait_ready(1)
        assert srv.synth("One line from the worker, please.", stream=False).status_code == 200
        lines = srv.log_lines()
    finally:
        srv.stop()
    done = [line for line in lines if "stream_done" in line]
    assert done, "\n".join(lines[-15:])  # the worker's own line, written before its last chunk
    assert not [line for line in lines if line.lstrip().startswith("{")], "\n".join(lines[-15:])
