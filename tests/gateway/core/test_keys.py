"""API keys, per-key quotas and CORS on a real server (real workers, the real voice), and the
key file and ``ttsvc keys`` on their own."""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import queue
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from multiprocessing.managers import DictProxy
from pathlib import Path
from threading import Event

import httpx
import pytest

from tests.gateway.serving import HEALTH_POLLS, Server, bearer, keyed_server, write_keys
from ttsvc.config import Settings
from ttsvc.errors import Unauthorized
from ttsvc.gateway.core.keys import KeyFileError, KeyStore, hash_key, parse_keys
from ttsvc.gateway.core.quotas import Quota
from ttsvc.repository.layout import EngineVersion

ORIGIN = "https://app.example.com"


def keys_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``ttsvc keys ...`` as a user runs it: a real subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "ttsvc.cli", "keys", *args], capture_output=True, text=True,
        timeout=120, check=False, env={**os.environ, **(env or {})},
    )  # fmt: skip
SPEECH = {"model": "tts-1", "voice": "alloy", "input": "Hi.", "response_format": "wav"}


@pytest.fixture(scope="module")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("auth-keys") / "keys"


@pytest.fixture(scope="module")
def keys(key_file: Path) -> dict[str, str]:
    return write_keys(key_file, {"alice": {}, "flood": {"rpm": 2}, "tiny": {"audio_s_per_min": 1}})


@pytest.fixture(scope="module")
def server(
    default_version: EngineVersion, engines_root: Path, key_file: Path, keys: dict[str, str]
) -> Iterator[Server]:
    with keyed_server(engines_root, key_file, keys["alice"], "--cors-origin", ORIGIN,
                      "--api-docs") as srv:  # fmt: skip
        yield srv


def post(server: Server, key: str | None, path: str = "/synthesize",
         body: dict[str, object] | None = None) -> httpx.Response:  # fmt: skip
    headers = bearer(key) if key is not None else {}
    with httpx.Client(base_url=server.url, timeout=60) as c:
        return c.post(path, json=body or {"text": "Hi."}, headers=headers)


@pytest.mark.parametrize(("path", "body"), [("/synthesize", None), ("/v1/audio/speech", SPEECH)])
def test_missing_wrong_and_valid_keys(
    server: Server, keys: dict[str, str], path: str, body: dict[str, object] | None
) -> None:
    missing = post(server, None, path, body)
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == 'Bearer realm="ttsvc"'
    wrong = post(server, keys["alice"][:-1] + "x", path, body)
    assert wrong.status_code == 401
    assert wrong.headers["www-authenticate"] == 'Bearer realm="ttsvc", error="invalid_token"'
    error = wrong.json() if path == "/synthesize" else wrong.json()["error"]
    assert error["type"] == "unauthorized"
    assert post(server, keys["alice"], path, body).status_code == 200


def test_probes_stay_open_and_everything_else_is_guarded(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as anonymous:
        assert anonymous.get("/health").status_code == 200
        assert anonymous.get("/live").status_code == 200
        for path in ("/voices", "/v1/models", "/docs", "/redoc", "/openapi.json"):
            refused = anonymous.get(path)
            error = refused.json()["error"] if path.startswith("/v1/") else refused.json()
            assert refused.status_code == 401 and error["type"] == "unauthorized"
    for path in ("/v1/models", "/docs", "/redoc", "/openapi.json"):
        assert server.client.get(path).status_code == 200
    assert "/synthesize" in server.client.get("/openapi.json").json()["paths"]


def test_request_quota_gives_429_with_retry_after(server: Server, keys: dict[str, str]) -> None:
    codes = [post(server, keys["flood"]).status_code for _ in range(3)]
    assert codes[-1] == 429  # two a minute (the first two may have gone in an earlier test)
    refused = post(server, keys["flood"])
    assert refused.status_code == 429 and refused.json()["type"] == "rate_limited"
    assert 1 <= int(refused.headers["retry-after"]) <= 30
    assert post(server, keys["alice"]).status_code == 200  # another key is unaffected


def test_audio_quota_gives_429_once_spent(server: Server, keys: dict[str, str]) -> None:
    first = post(server, keys["tiny"], body={"text": "About two seconds of audio, or so."})
    assert first.status_code == 200  # one request may overdraw the one second a minute
    refused = post(server, keys["tiny"])
    assert refused.status_code == 429 and "audio seconds" in refused.json()["error"]
    assert int(refused.headers["retry-after"]) >= 30  # over a second of debt at 1 s a minute


FLOOD_RATE = 100.0
"""Requests per second the over-quota key sends: fifty times its two a minute, twenty times the
other key's rate."""


def flood(url: str, key: str, flooding: Event, stop: Event, counts: DictProxy[int, int]) -> None:
    """An over-quota client sending ``FLOOD_RATE`` requests a second while ``flooding`` is set.

    Its own process (no GIL shared with the measuring client) and a fixed rate, not back to
    back: it stands for a client on another machine, and a closed loop here would measure how
    two cores are shared between the test's client, the gateway and the worker, not the server.
    """
    interval = 1.0 / FLOOD_RATE
    with httpx.Client(base_url=url, timeout=60, headers=bearer(key)) as c:
        due = time.monotonic()
        while not stop.is_set():
            if not flooding.wait(timeout=1.0):
                due = time.monotonic()
                continue
            code = c.post("/synthesize", json={"text": "Me again."}).status_code
            counts[code] = counts.get(code, 0) + 1
            due += interval
            if (ahead := due - time.monotonic()) > 0:
                stop.wait(ahead)  # pacing the load, not synchronising with anything
            else:
                due = time.monotonic()  # behind: go on at the rate, without a burst


def test_a_flooding_key_does_not_slow_another(server: Server, keys: dict[str, str]) -> None:
    """Latency of one key, idle and while an over-quota key floods, measured interleaved and
    compared as medians (robust to the odd slow request on a shared machine)."""
    for _ in range(3):
        post(server, keys["flood"])  # make sure it is over its quota

    def timed() -> float:
        started = time.perf_counter()
        r = server.client.post("/synthesize", json={"text": "Am I still served quickly?",
                                                    "stream": False})  # fmt: skip
        assert r.status_code == 200
        return time.perf_counter() - started

    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        flooding, stop, counts = manager.Event(), manager.Event(), manager.dict()
        flooder = ctx.Process(target=flood, args=(server.url, keys["flood"], flooding, stop,
                                                  counts))  # fmt: skip
        flooder.start()
        idle: list[float] = []
        loaded: list[float] = []
        try:
            timed()  # warm
            for _ in range(15):
                flooding.clear()
                idle.append(timed())
                flooding.set()
                loaded.append(timed())
        finally:
            stop.set()
            flooding.set()
            flooder.join(timeout=60)
        codes = dict(counts)
    ratio = statistics.median(loaded) / statistics.median(idle)
    rate = sum(codes.values()) / sum(loaded)
    print(f"victim latency median idle {1000 * statistics.median(idle):.0f} ms, "
          f"flooded {1000 * statistics.median(loaded):.0f} ms, ratio {ratio:.2f}, "
          f"flood {codes} at ~{rate:.0f}/s")  # fmt: skip
    assert set(codes) == {429}  # refused at admission, never served
    assert rate >= FLOOD_RATE / 2  # it did flood while the other key was measured
    assert ratio <= 2.0


LONG_TEXT = "A caller who keeps the line open for a long while, on and on. " * 20
"""About a minute of audio: a stream that is still running when the next requests arrive (the
test also never reads its body, so it cannot finish before the test lets go of it)."""


@pytest.fixture(scope="module")
def pair(
    default_version: EngineVersion, tmp_path_factory: pytest.TempPathFactory, engines_root: Path
) -> Iterator[tuple[Server, dict[str, str]]]:
    """Two keys on four slots: ``flood`` takes the fair share (half), ``quiet`` its line's one."""
    key_file = tmp_path_factory.mktemp("pair-keys") / "keys"
    keys = write_keys(key_file, {"flood": {}, "quiet": {"streams": 1}})
    srv = Server(engines_root, "--workers", "1", "--max-streams-per-worker", "4",
                 "--api-keys-file", str(key_file), headers=bearer(keys["quiet"]))  # fmt: skip
    srv.wait_ready(1)
    yield srv, keys
    srv.stop()


def test_a_flooding_key_keeps_to_its_share_of_the_stream_slots(
    pair: tuple[Server, dict[str, str]],
) -> None:
    server, keys = pair
    with contextlib.ExitStack() as held, httpx.Client(base_url=server.url, timeout=60) as c:

        def open_stream(key: str, text: str = LONG_TEXT) -> httpx.Response:
            return held.enter_context(c.stream("POST", "/synthesize", json={"text": text},
                                               headers=bearer(key)))  # fmt: skip

        assert [open_stream(keys["flood"]).status_code for _ in range(2)] == [200, 200]
        refused = open_stream(keys["flood"])  # two of four slots are its share
        refused.read()
        assert refused.status_code == 429, refused.text
        assert refused.json()["type"] == "key_streams_exceeded"
        assert refused.headers["retry-after"] == "1"
        # the other key is served while the flood holds all it may
        assert post(server, keys["quiet"], body={"text": "Still there?"}).status_code == 200
        assert open_stream(keys["quiet"]).status_code == 200
        own = post(server, keys["quiet"])  # its key line allows one stream at a time
        assert own.status_code == 429 and own.json()["type"] == "key_streams_exceeded"
    server.wait_idle()  # the held streams were cancelled when the client let go
    assert post(server, keys["flood"]).status_code == 200  # and their slots came back
    lines = [json.loads(x) for x in server.log_lines() if '"event": "request"' in x]
    refusals = [x for x in lines if x.get("status") == "key_streams_exceeded"]
    assert {(x["key"], x["code"]) for x in refusals} == {("flood", 429), ("quiet", 429)}
    assert len(refusals) == 2  # one completion line each
    text = httpx.get(server.metrics_url, timeout=10).text
    assert 'ttsvc_rejections_total{reason="key_streams_exceeded"} 2.0' in text


def test_keys_never_reach_the_logs(server: Server, keys: dict[str, str]) -> None:
    for key in keys.values():
        post(server, key)
        post(server, key + "0")  # a near miss
        post(server, key, "/v1/audio/speech", SPEECH)
    logs = "\n".join(server.log_lines())
    for key in keys.values():
        assert key not in logs
        assert key[len("ttsvc-") :][:16] not in logs
    assert '"key": "alice"' in logs  # requests are logged under the key's name


def test_rejections_are_counted_by_reason(server: Server, keys: dict[str, str]) -> None:
    post(server, None)
    post(server, keys["flood"])
    text = httpx.get(server.metrics_url, timeout=10).text
    for reason in ("unauthorized", "rate_limited"):
        match = re.search(rf'ttsvc_rejections_total{{reason="{reason}"}} (\S+)', text)
        assert match and float(match.group(1)) >= 1
    assert re.search(r'ttsvc_format_requests_total{api="openai",format="wav"} [1-9]', text)


def test_a_key_added_while_serving_is_accepted(server: Server, key_file: Path) -> None:
    added = keys_cli("add", "late-comer", "--file", str(key_file), "--rpm", "100")
    assert added.returncode == 0, added.stderr
    key = added.stdout.strip()
    assert key.startswith("ttsvc-") and key not in key_file.read_text()
    for _ in range(HEALTH_POLLS):  # the watcher reloads the file: bounded probes
        # probed with the route's own method: a POST is refused 405 before the key is checked,
        # which ended the wait at once and left the test racing the reload
        if httpx.get(f"{server.url}/v1/models", headers=bearer(key)).status_code != 401:
            break
        try:
            server.proc.wait(timeout=0.05)  # block on the server briefly instead of sleeping
        except subprocess.TimeoutExpired:  # still running, as it should be
            pass
    with httpx.Client(base_url=server.url, timeout=10, headers=bearer(key)) as c:
        assert c.get("/v1/models").status_code == 200


def test_cors_only_for_configured_origins(server: Server) -> None:
    preflight = {"Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type"}  # fmt: skip
    with httpx.Client(base_url=server.url, timeout=10) as c:
        ok = c.options("/v1/audio/speech", headers={"Origin": ORIGIN, **preflight})
        assert ok.status_code == 200
        assert ok.headers["access-control-allow-origin"] == ORIGIN
        other = c.options("/v1/audio/speech", headers={"Origin": "https://evil.example",
                                                       **preflight})  # fmt: skip
        assert "access-control-allow-origin" not in other.headers
        refused = c.post("/synthesize", json={"text": "hi"}, headers={"Origin": ORIGIN})
        assert refused.status_code == 401  # a browser can read why
        assert refused.headers["access-control-allow-origin"] == ORIGIN


def test_key_file_lines() -> None:
    digest = hash_key("k")
    keys = parse_keys(f"# tenants\nalice {digest}\n\nbob {digest[::-1]} rpm=5 audio_s_per_min=2.5"
                      "  # comment\n", "keys", Quota(100, None))  # fmt: skip
    assert [k.name for k in keys] == ["alice", "bob"]
    assert keys[0].quota == Quota(100, None)  # the default fills what a line leaves out
    assert keys[1].quota == Quota(5, 2.5)
    streams = parse_keys(f"carol {digest} streams=2\ndan {digest}", "keys", Quota(None, None, 3))
    assert [k.quota.streams for k in streams] == [2, 3]  # the default setting fills it too
    for bad in (f"alice {digest}\nalice {digest}", "alice nothex", f"a {digest} rpm=0",
                f"a {digest} burst=3", f"a b {digest}", f"a {digest} streams=0",
                f"a {digest} streams=1.5", f"a {digest} audio_s_per_min=inf"):  # fmt: skip
        with pytest.raises(KeyFileError, match="keys:"):
            parse_keys(bad, "keys", Quota())


def test_authenticate_without_a_server(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    key = write_keys(path, {"one": {"rpm": 1}})["one"]
    store = KeyStore(path, Quota())
    store.load()
    assert store.authenticate(f"Bearer {key}").name == "one"
    assert store.authenticate(f"bearer  {key}").quota == Quota(1, None)
    for header, presented in ((None, False), ("", False), (f"Basic {key}", True),
                              ("Bearer ", True), (f"Bearer {key}x", True)):  # fmt: skip
        with pytest.raises(Unauthorized) as refused:
            store.authenticate(header)
        assert refused.value.presented is presented
        assert key not in refused.value.message


def test_keys_cli_refuses_duplicates_and_needs_a_file(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    added = keys_cli("add", "svc", env={"TTSVC_API_KEYS_FILE": str(path)})
    assert added.returncode == 0, added.stderr
    key = added.stdout.strip()
    assert key not in added.stderr
    assert path.read_text() == f"svc {hash_key(key)}\n"
    assert path.stat().st_mode & 0o077 == 0  # not readable by others
    limited = keys_cli("add", "one-stream", "--file", str(path), "--streams", "1")
    assert limited.returncode == 0, limited.stderr
    assert parse_keys(path.read_text(), "keys", Quota())[-1].quota == Quota(streams=1)
    line = path.read_text()
    again = keys_cli("add", "svc", "--file", str(path), "--audio-s-per-min", "30")
    assert again.returncode == 2 and "exists already" in again.stderr
    assert path.read_text() == line
    nowhere = keys_cli("add", "other", env={"TTSVC_API_KEYS_FILE": ""})
    assert nowhere.returncode == 2 and "--file" in nowhere.stderr


@pytest.mark.parametrize(
    "settings",
    [{"cors_origins": ["app.example.com"]}, {"cors_origins": ["https://a.example/path"]},
     {"voice_aliases": {"alloy": ""}}, {"default_rpm": 0}],
)  # fmt: skip
def test_unsafe_access_settings_are_refused(settings: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Settings(**settings)  # type: ignore[arg-type]
    assert Settings(api_keys_file="").api_keys_file is None  # type: ignore[arg-type]


class ObservedKeyStore(KeyStore):
    """A key store that reports each reload attempt (the watcher reads files in a thread)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, Quota(), polling=True)
        self.attempts: queue.Queue[bool] = queue.Queue()

    def load(self) -> None:
        try:
            super().load()
        except ValueError:
            self.attempts.put(False)
            raise
        self.attempts.put(True)


def test_key_store_reloads_and_keeps_its_keys_when_a_file_does_not_parse(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    first = write_keys(path, {"one": {}})["one"]
    store = ObservedKeyStore(path)
    store.load()
    assert store.attempts.get_nowait()

    async def scenario() -> None:
        watcher = asyncio.create_task(store.watch())
        try:
            # the watcher starts in the background with no "ready" signal: edit until it sees one
            for attempt in range(60):
                await asyncio.to_thread(path.write_text, f"one not-a-hash # {attempt}\n")
                with contextlib.suppress(queue.Empty):
                    assert await asyncio.to_thread(store.attempts.get, True, 1.0) is False
                    break
            else:
                raise AssertionError("the watcher never reloaded the key file")
            assert store.authenticate(f"Bearer {first}").name == "one"  # old keys still serve
            fixed = tmp_path / "fixed"
            second = write_keys(fixed, {"two": {}})["two"]
            await asyncio.to_thread(fixed.replace, path)  # an atomic rename, as Secrets update
            while not await asyncio.to_thread(store.attempts.get, True, 30):
                pass
            assert store.authenticate(f"Bearer {second}").name == "two"
            with pytest.raises(Unauthorized):
                store.authenticate(f"Bearer {first}")
        finally:
            store.stop()
            await asyncio.gather(watcher, return_exceptions=True)

    asyncio.run(scenario())
