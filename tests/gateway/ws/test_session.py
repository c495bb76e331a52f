"""``/synthesize/stream`` against a real ``ttsvc serve``, driven by the ``websockets`` client (a
WebSocket implementation other than the server's wsproto): text token by token in, each
sentence's audio out once and in order, flush, end, keys and quotas, bad messages, a client
that leaves, and a shutdown under way."""

from __future__ import annotations

import base64
import json
import re
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.gateway.serving import Server, bearer, keyed_server, metric, wait_until, write_keys
from ttsvc.repository.layout import EngineVersion
from ttsvc.text.segment import split_sentences

TEXT = "The first sentence is here. A second one follows it! And a third, the last one."
SILENCE_S = 0.2
"""The default ``sentence_silence``."""
LONG = ("This long sentence keeps the worker busy for many seconds of speech, so that a "
        "client who leaves early leaves it far from done, with a great deal of audio to make.")
DETERMINISTIC = {"noise_scale": 0, "noise_w": 0}
RECV_S = 120
Message = dict[str, Any]


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    path = tmp_path_factory.mktemp("ws-keys") / "keys"
    quotas = {"alice": {}, "leaver": {}, "tight": {"rpm": 2}, "solo": {"streams": 1}}
    return path, write_keys(path, quotas)


@pytest.fixture(scope="module")
def server(
    default_version: EngineVersion, engines_root: Path, keys: tuple[Path, dict[str, str]]
) -> Iterator[Server]:
    path, names = keys
    with keyed_server(engines_root, path, names["alice"]) as srv:
        yield srv


def url(srv: Server) -> str:
    return srv.url.replace("http://", "ws://") + "/synthesize/stream"


def open_ws(srv: Server, key: str, via: str = "header") -> ClientConnection:
    if via == "header":
        return connect(url(srv), additional_headers=bearer(key), open_timeout=30)
    return connect(url(srv), subprotocols=["ttsvc", f"bearer.{key}"], open_timeout=30)  # type: ignore[list-item]


def send(ws: ClientConnection, kind: str, **fields: object) -> None:
    ws.send(json.dumps({"type": kind, **fields}))


def read_until(ws: ClientConnection, kind: str) -> list[Message]:
    """Messages up to and including the first of type ``kind``."""
    out: list[Message] = []
    while not out or out[-1]["type"] != kind:
        out.append(json.loads(ws.recv(timeout=RECV_S)))
    return out


def read_to_close(ws: ClientConnection) -> list[Message]:
    out: list[Message] = []
    while True:
        try:
            out.append(json.loads(ws.recv(timeout=RECV_S)))
        except ConnectionClosed:
            return out


def audio_of(messages: list[Message]) -> dict[int, list[bytes]]:
    """Each sentence's audio messages, decoded, in the order they came."""
    out: dict[int, list[bytes]] = {}
    for m in messages:
        if m["type"] == "audio":
            out.setdefault(m["sentence"], []).append(base64.b64decode(m["audio"]))
    return out


def assert_contiguous(messages: list[Message]) -> int:
    """Audio offsets follow each other sample for sample; returns the samples sent."""
    offset = 0
    for m in messages:
        if m["type"] == "audio":
            assert m["offset"] == offset, m["offset"]
            offset += len(base64.b64decode(m["audio"])) // 2
    return offset


def pcm(data: bytes) -> np.ndarray:  # type: ignore[type-arg]
    return np.frombuffer(data, dtype="<i2").astype(np.float64)


def snr_db(got: bytes, ref: bytes) -> float:
    a, b = pcm(got), pcm(ref)
    return float(10 * np.log10(np.sum(b**2) / max(np.sum((a - b) ** 2), 1e-9)))


def events(srv: Server, name: str) -> list[Message]:
    return [e for line in srv.log_lines() if line.startswith("{")
            if (e := json.loads(line))["event"] == name]  # fmt: skip



def test_tokens_one_by_one_speak_each_sentence_once_in_order_then_close(
    server: Server, keys: tuple[Path, dict[str, str]]
) -> None:
    srv, key = server, keys[1]["alice"]
    before = metric(srv, "ttsvc_format_requests_total", format="pcm", api="websocket")
    expected = split_sentences(TEXT)
    assert len(expected) == 3
    with open_ws(srv, key) as ws:
        send(ws, "start", **DETERMINISTIC)
        for token in re.findall(r"\S+\s*", TEXT):  # as an LLM sends them: word and space
            send(ws, "append", text=token)
        send(ws, "end")
        messages = read_to_close(ws)
        assert ws.close_code == 1000
    started, *middle, done = messages
    assert started["type"] == "started" and started["sample_rate"] == 22050
    assert {m["type"] for m in middle} == {"audio"}, middle  # no error, nothing after done
    order = [m["sentence"] for m in middle]
    assert order == sorted(order) and set(order) == {0, 1, 2}
    total = assert_contiguous(messages)
    # the audio the client was sent, the pauses between sentences included
    assert done == {"type": "done", "sentences": 3, "offset": total,
                    "audio_s": round(total / 22050, 3)}  # fmt: skip
    # each sentence once: its audio is what /synthesize makes of it alone, after the silence
    # between sentences of one turn
    silence = bytes(2 * round(SILENCE_S * 22050))
    spoken = audio_of(messages)
    for index, sentence in enumerate(expected):
        got = b"".join(spoken[index])
        if index:
            assert spoken[index][0] == silence
            got = got[len(silence):]
        ref = srv.client.post("/synthesize", json={"text": sentence, "format": "pcm",
                                                   **DETERMINISTIC})  # fmt: skip
        assert ref.status_code == 200
        assert len(got) == len(ref.content), index
        assert snr_db(got, ref.content) > 30, index
    # each sentence was one request: its line, its metrics, the key's name
    lines = [e for e in events(srv, "request") if e.get("format") == "pcm"][-6:-3]
    assert [e["text_len"] for e in lines] == [len(s) for s in expected]
    assert {(e["code"], e["status"], e["key"]) for e in lines} == {(200, "ok", "alice")}
    assert metric(srv, "ttsvc_format_requests_total", format="pcm", api="websocket") == before + 3


def test_flush_speaks_a_partial_sentence_and_the_session_goes_on(
    server: Server, keys: tuple[Path, dict[str, str]]
) -> None:
    with open_ws(server, keys[1]["alice"], via="subprotocol") as ws:
        assert ws.subprotocol == "ttsvc"
        send(ws, "append", text="Half a thought with no end")
        send(ws, "flush")
        first = read_until(ws, "flushed")
        assert first[0]["type"] == "started"
        assert set(audio_of(first)) == {0}
        assert first[-1] == {"type": "flushed", "sentences": 1, "offset": assert_contiguous(first)}
        send(ws, "append", text="Now the second turn")
        send(ws, "append", text=". And")  # ends sentence 1: audio with no flush
        second = read_until(ws, "audio")
        assert second[-1]["sentence"] == 1
        send(ws, "end")
        rest = read_to_close(ws)
        assert ws.close_code == 1000
    messages = first + second + rest
    assert rest[-1]["type"] == "done" and rest[-1]["sentences"] == 3
    assert rest[-1]["offset"] == assert_contiguous(messages)
    spoken = audio_of(messages)
    silence = bytes(2 * round(SILENCE_S * 22050))
    assert spoken[1][0] != silence  # a turn's first sentence starts at once
    assert spoken[2][0] == silence  # the next one of the same turn after the pause


def test_keys_are_required_from_a_header_or_a_subprotocol_and_origins_checked(
    server: Server, keys: tuple[Path, dict[str, str]]
) -> None:
    refused_before = metric(server, "ttsvc_requests_total", code="401", outcome="unauthorized")
    with pytest.raises(InvalidStatus) as missing:
        connect(url(server), open_timeout=30)
    response = missing.value.response
    assert response.status_code == 401
    assert json.loads(response.body or b"")["type"] == "unauthorized"
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="ttsvc"'
    with pytest.raises(InvalidStatus) as wrong:
        connect(url(server), subprotocols=["ttsvc", "bearer.ttsvc-nope"],  # type: ignore[list-item]
                open_timeout=30)  # fmt: skip
    assert wrong.value.response.status_code == 401
    assert metric(server, "ttsvc_requests_total", code="401",
                  outcome="unauthorized") == refused_before + 2  # fmt: skip
    for via in ("header", "subprotocol"):
        with open_ws(server, keys[1]["alice"], via=via) as ws:
            send(ws, "start")
            assert read_until(ws, "started")
    # CORS does not cover WebSockets: a page of another origin is refused as CORS would refuse
    # it a reading of the HTTP API (none is allowed here), a page of this origin is not
    key = keys[1]["alice"]
    with pytest.raises(InvalidStatus) as foreign:
        connect(url(server), origin="https://elsewhere.example",  # type: ignore[arg-type]
                additional_headers=bearer(key), open_timeout=30)  # fmt: skip
    assert foreign.value.response.status_code == 403
    assert json.loads(foreign.value.response.body or b"")["type"] == "origin_not_allowed"
    with connect(url(server), origin=server.url, additional_headers=bearer(key),  # type: ignore[arg-type]
                 open_timeout=30) as ws:  # fmt: skip
        send(ws, "start")
        assert read_until(ws, "started")


def test_quotas_apply_per_sentence_as_to_http_requests(
    server: Server, keys: tuple[Path, dict[str, str]]
) -> None:
    text = "One is fine. Two is fine. Three is one too many."
    with open_ws(server, keys[1]["tight"]) as ws:  # two requests per minute
        send(ws, "append", text=text)
        send(ws, "end")
        messages = read_to_close(ws)
    errors = [m for m in messages if m["type"] == "error"]
    assert [(e["code"], e["status"], e["sentence"]) for e in errors] == [("rate_limited", 429, 2)]
    assert set(audio_of(messages)) == {0, 1}
    assert messages[-1]["type"] == "done"
    # a key that may hold one stream: the next sentence waits for the one before, not a 429
    with open_ws(server, keys[1]["solo"]) as ws:
        send(ws, "append", text=text)
        send(ws, "end")
        messages = read_to_close(ws)
    assert not [m for m in messages if m["type"] == "error"], messages
    assert set(audio_of(messages)) == {0, 1, 2}


def test_bad_messages_get_an_error_naming_the_field_and_the_session_goes_on(
    server: Server, keys: tuple[Path, dict[str, str]]
) -> None:
    workers = server.worker_pids()
    too_long = "x" * 4097
    with open_ws(server, keys[1]["alice"]) as ws:
        bad: list[tuple[object, str, str]] = [
            (b"\x00\x01", "invalid_parameter", "message"),
            ("not json", "invalid_parameter", "message"),
            ({"type": "shout"}, "invalid_parameter", "type"),
            ({"text": "no type"}, "invalid_parameter", "type"),
            ({"type": "start", "speed": 10}, "invalid_parameter", "speed"),
            ({"type": "start", "voice": "nobody"}, "unknown_voice", "voice"),
            ({"type": "append", "text": 5}, "invalid_parameter", "text"),
            ({"type": "append", "text": too_long}, "text_too_long", "text"),
            ({"type": "start"}, "invalid_parameter", "type"),  # after an append: too late
        ]
        for message, code, field in bad:
            if isinstance(message, dict):
                ws.send(json.dumps(message))
            else:
                ws.send(message)  # type: ignore[arg-type]
            got = [m for m in read_until(ws, "error") if m["type"] != "started"]
            assert got == [{"type": "error", "error": got[0]["error"], "code": code,
                            "status": got[0]["status"], "field": field}], message  # fmt: skip
        # a sentence the voice cannot speak fails alone, with its index
        send(ws, "append", text="你好世界。 Then English works. ")
        send(ws, "end")
        messages = read_to_close(ws)
        assert ws.close_code == 1000
    errors = [m for m in messages if m["type"] == "error"]
    assert [(e["code"], e["sentence"]) for e in errors] == [("unsupported_script", 0)]
    assert set(audio_of(messages)) == {1}
    assert messages[-1]["type"] == "done"
    assert server.worker_pids() == workers  # no worker crashed or was replaced
    # a message over the body cap is refused by the WebSocket layer, as a body is by HTTP's
    with open_ws(server, keys[1]["alice"]) as ws:
        send(ws, "append", text="x" * 70_000)
        assert read_to_close(ws) == []
        assert ws.close_code == 1009


def test_a_client_that_leaves_mid_stream_cancels_its_sentences_in_the_worker(
    server: Server, keys: tuple[Path, dict[str, str]]
) -> None:
    srv = server
    cancelled_before = metric(srv, "ttsvc_cancellations_total")
    with open_ws(srv, keys[1]["leaver"]) as ws:
        send(ws, "append", text=" ".join([LONG] * 6) + " And")
        read_until(ws, "audio")
        ws.socket.shutdown(socket.SHUT_RDWR)  # gone without a closing handshake, as if crashed
    srv.wait_idle()
    session = wait_until(srv, lambda: events(srv, "websocket_session"),
                         lambda found: any(e["key"] == "leaver" for e in found),
                         "the session's line")[-1]  # fmt: skip
    assert session["client_left"] and session["sentences"] == 6
    lines = [e for e in events(srv, "request") if e["key"] == "leaver"]
    # at most the sentence streaming and the next were dispatched; the other four never were
    assert 1 <= len(lines) <= 2, lines
    assert {(e["code"], e["status"]) for e in lines} == {(499, "cancelled")}
    # the worker stopped them: once it has ended every stream, neither had run to its end
    wait_until(srv, lambda: metric(srv, "ttsvc_streams_in_flight", worker="0"),
               lambda streams: streams == 0, "no stream left on the worker")  # fmt: skip
    uids = {e["uid"] for e in lines}
    assert not [e for e in events(srv, "stream_done") if e.get("uid") in uids]
    assert metric(srv, "ttsvc_cancellations_total") == cancelled_before + len(lines)


def test_a_shutdown_finishes_the_sentences_under_way_then_ends_the_session(
    default_version: EngineVersion, engines_root: Path
) -> None:
    srv = Server(engines_root, "--workers", "1")
    try:
        srv.wait_ready(1)
        with connect(url(srv), open_timeout=30) as ws:
            send(ws, "append", text=" ".join([LONG] * 4) + " And")
            messages = read_until(ws, "audio")
            srv.proc.send_signal(signal.SIGTERM)
            messages += read_to_close(ws)
            assert ws.close_code == 1012  # service restart: reconnect elsewhere
        assert srv.proc.wait(timeout=120) == 0
        errors = [m for m in messages if m["type"] == "error"]
        # the sentence streaming and the one dispatched with it were spoken whole; the next
        # one was refused, and said so before the close
        assert [(e["code"], e["sentence"]) for e in errors] == [("draining", 2)]
        spoken = audio_of(messages)
        assert set(spoken) == {0, 1}
        lines = events(srv, "request")
        assert sorted((e["code"], e["status"]) for e in lines) == [(200, "ok"), (200, "ok"),
                                                                   (503, "draining")]  # fmt: skip
        for index, line in enumerate(e for e in lines if e["status"] == "ok"):
            samples = sum(len(a) for a in spoken[index]) // 2
            silence = round(SILENCE_S * 22050) if index else 0
            assert abs((samples - silence) / 22050 - line["audio_s"]) < 0.001
    finally:
        srv.stop()


def test_with_timestamps_audio_messages_carry_the_words_of_the_whole_text(
    server: Server, keys: tuple[Path, dict[str, str]]
) -> None:
    """``timestamps`` at start: each sentence's words come with the audio, on the session's
    timeline (seconds from its first sample) and with spans into the session's whole text."""
    srv, key = server, keys[1]["alice"]
    with open_ws(srv, key) as ws:
        send(ws, "start", timestamps=True, **DETERMINISTIC)
        for token in re.findall(r"\S+\s*", TEXT):
            send(ws, "append", text=token)
        send(ws, "end")
        messages = read_to_close(ws)
    audio = [m for m in messages if m["type"] == "audio"]
    words = [w for m in audio for w in m.get("words", [])]
    spoken = [re.sub(r"\W", "", TEXT[slice(*w["text_span"])]) for w in words]
    assert spoken == [re.sub(r"\W", "", t) for t in TEXT.split()]  # every word once, in order
    assert [w["word"].lower() for w in words] == [s.lower() for s in spoken]
    rate = 22050
    for m in audio:  # a word starts in the message that carries it
        begin = m["offset"] / rate
        end = begin + len(base64.b64decode(m["audio"])) / 2 / rate
        for w in m.get("words", []):
            assert begin - 1e-3 <= w["start"] < end + 1e-3 and w["start"] < w["end"]


def test_a_sentence_with_nothing_to_speak_is_a_short_silence_marked_so(
    server: Server, keys: tuple[Path, dict[str, str]]
) -> None:
    """An emoji between two sentences (the session cuts it as one): its audio message is 50 ms
    of zeros with ``empty_text: true``, the others speak, and nothing is an error."""
    before = len(server.completions())
    with open_ws(server, keys[1]["alice"]) as ws:
        send(ws, "start", sample_rate=16000)
        send(ws, "append", text="Hello there. \U0001f642! See you soon.")
        send(ws, "end")
        messages = read_to_close(ws)
    assert "error" not in {m["type"] for m in messages}
    audio = audio_of(messages)
    assert sorted(audio) == [0, 1, 2]
    (empty,) = [m for m in messages if m.get("empty_text")]
    assert empty["sentence"] == 1
    # the pause before it, then its silence
    assert b"".join(audio[1]) == bytes(2 * round(SILENCE_S * 16000) + 2 * round(0.05 * 16000))
    assert all(pcm(b"".join(audio[i])).std() > 300 for i in (0, 2))
    lines = server.completions()[before:]
    assert [(line["status"], line["code"]) for line in lines] == [
        ("ok", 200), ("empty_text", 200), ("ok", 200)]  # fmt: skip


def test_empty_text_error_in_start_makes_such_a_sentence_an_error_message(
    server: Server, keys: tuple[Path, dict[str, str]]
) -> None:
    with open_ws(server, keys[1]["alice"]) as ws:
        send(ws, "start", empty_text="error")
        send(ws, "append", text="\U0001f642! ")
        send(ws, "end")
        messages = read_to_close(ws)
    (error,) = [m for m in messages if m["type"] == "error"]
    assert (error["code"], error["status"], error["sentence"]) == ("empty_text", 422, 0)
    assert not audio_of(messages) and messages[-1]["type"] == "done"
