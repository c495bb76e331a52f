"""``stream_format: "sse"`` on ``/v1/audio/speech``: OpenAI's speech events, read with httpx from
a real server (real workers, the real voice): event names and order, base64 that decodes to the
audio the plain stream sends (PCM at 24 kHz), usage, and errors before and after the start."""

from __future__ import annotations

import base64
import io
import json
import math
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf

from tests.audio.decoding import decode, decode_both, rms
from tests.gateway.serving import Server, wait_until
from ttsvc.gateway.http.sse import SpeechEventBody
from ttsvc.repository.layout import EngineVersion

TEXT = "Streaming events for agents. Each one carries a little audio."
LONG = "This answer keeps its worker busy for a good long while, sentence after sentence. " * 30
FRAMES_PER_S = 22050 / 256
"""The voice's acoustic frames per second: its rate over its hop."""


def sse_events(lines: Iterator[str]) -> list[dict[str, object]]:
    """The events of an SSE body as any SSE reader parses them: ``data:`` lines, each event
    ended by a blank line; OpenAI's framing has no other field."""
    events, data = [], []
    for line in lines:
        if line == "":
            if data:
                events.append(json.loads("\n".join(data)))
            data = []
            continue
        field, _, value = line.partition(":")
        assert field == "data", line  # no event:, id: or comment lines
        data.append(value.removeprefix(" "))
    assert not data, "the last event was not ended by a blank line"
    return events


def speech(**body: object) -> dict[str, object]:
    return {"model": "gpt-4o-mini-tts", "voice": "alloy", "input": TEXT, **body}


def post_sse(server: Server, **body: object) -> tuple[httpx.Response, list[dict[str, object]]]:
    with server.client.stream("POST", "/v1/audio/speech",
                              json=speech(stream_format="sse", **body)) as r:  # fmt: skip
        assert r.status_code == 200, r.read()
        return r, sse_events(r.iter_lines())


def joined_audio(events: list[dict[str, object]]) -> bytes:
    """The deltas' audio, decoded and joined; checks that only the last event is ``done``."""
    *deltas, done = events
    assert done["type"] == "speech.audio.done"
    assert deltas and all(e["type"] == "speech.audio.delta" for e in deltas)
    assert all(set(e) == {"type", "audio"} for e in deltas)  # OpenAI's keys exactly
    return b"".join(base64.b64decode(str(e["audio"]), validate=True) for e in deltas)


@pytest.fixture(scope="module")
def reference_s(server: Server) -> float:
    """The text's duration from the plain audio stream (the same voice and noise)."""
    r = server.client.post("/v1/audio/speech", json=speech(response_format="wav"))
    assert r.status_code == 200, r.text
    pcm, rate = decode(r.content, "wav")
    return len(pcm) / rate


def test_pcm_deltas_are_24khz_audio_and_done_comes_last_with_usage(
    server: Server, reference_s: float
) -> None:
    r, events = post_sse(server, response_format="pcm")
    assert r.headers["content-type"].split(";")[0] == "text/event-stream"
    assert r.headers["x-sample-rate"] == "24000"
    assert r.headers["cache-control"] == "no-store"
    assert len(events) > 2  # streamed: more than one delta before done
    pcm, rate = decode(joined_audio(events), "pcm", 24000)
    assert rms(pcm) > 300
    # at 24 kHz, as long as the plain stream's audio (durations are drawn with noise: 20 %)
    assert abs(len(pcm) / rate - reference_s) <= 0.2 * reference_s, (len(pcm), reference_s)
    usage = events[-1]["usage"]
    assert isinstance(usage, dict)
    assert usage["input_tokens"] == len(TEXT)
    assert abs(usage["output_tokens"] - len(pcm) / 24000 * FRAMES_PER_S) < 1
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert set(events[-1]) == {"type", "usage"}


@pytest.mark.parametrize("text", ["...", "  "])
def test_nothing_to_say_is_an_event_stream_of_a_short_silence(server: Server, text: str) -> None:
    """An agent's turn with nothing speakable gets its stream: one delta of 50 ms of zeros (the
    audio frame the frameworks wait for, not a 422 they count as a failed turn), then
    ``done``."""
    r, events = post_sse(server, response_format="pcm", input=text)
    assert r.headers["x-empty-text"] == "true"
    assert joined_audio(events) == bytes(2 * round(0.05 * 24000))
    assert events[-1]["usage"]["output_tokens"] == math.ceil(0.05 * FRAMES_PER_S)  # type: ignore[index]


@pytest.mark.parametrize("fmt", ["wav", "mp3", "opus"])
def test_deltas_join_into_the_file_the_audio_stream_sends(
    server: Server, reference_s: float, fmt: str
) -> None:
    _, events = post_sse(server, response_format=fmt)
    pcm, rate = decode_both(joined_audio(events), fmt, 24000)
    assert rate == 24000 and rms(pcm) > 300
    slack = 0.2 * reference_s + (0.13 if fmt == "mp3" else 0.0)  # mp3's delay and padding
    assert abs(len(pcm) / rate - reference_s) <= slack, (fmt, len(pcm) / rate, reference_s)


def test_a_whole_file_format_comes_in_one_delta(server: Server) -> None:
    """FLAC is sent only whole (its header holds the sample count): one delta, then done."""
    _, events = post_sse(server, response_format="flac")
    assert [e["type"] for e in events] == ["speech.audio.delta", "speech.audio.done"]
    data = joined_audio(events)
    pcm, rate = decode_both(data, "flac")
    assert rate == 24000 and sf.info(io.BytesIO(data)).frames == len(pcm)


def test_the_plain_audio_stream_is_unchanged(server: Server) -> None:
    """``stream_format: "audio"`` (and its absence) is the audio itself, not events."""
    for body in ({}, {"stream_format": "audio"}):
        r = server.client.post("/v1/audio/speech", json=speech(response_format="pcm",
                                                               **body))  # fmt: skip
        assert r.headers["content-type"] == "audio/L16;rate=24000;channels=1"
        assert not r.content.startswith(b"data:")
        assert rms(np.frombuffer(r.content, "<i2")) > 300


@pytest.mark.parametrize(
    ("body", "status", "err_type", "param"),
    [
        ({"voice": "nobody"}, 404, "unknown_voice", "voice"),
        ({"input": "x" * 4097}, 422, "invalid_parameter", "input"),
        ({"stream_format": "chunks"}, 422, "invalid_parameter", "stream_format"),
        ({"response_format": "aac"}, 422, "format_unavailable", "response_format"),
        # the checks that need no voice come before it is looked up (or waited for)
        ({"response_format": "aac", "voice": "nobody"}, 422, "format_unavailable",
         "response_format"),
        ({"timestamps": True, "stream_format": "audio", "voice": "nobody"}, 422,
         "invalid_parameter", "timestamps"),
    ],
)  # fmt: skip
def test_errors_before_the_stream_are_json(
    server: Server, body: dict[str, object], status: int, err_type: str, param: str
) -> None:
    r = server.client.post("/v1/audio/speech", json={**speech(stream_format="sse"),
                                                     **body})  # fmt: skip
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert error["type"] == err_type and error["param"] == param and error["message"]


def test_a_stream_that_fails_midway_ends_with_an_error_event_and_is_cut(
    default_version: EngineVersion, engines_root: Path
) -> None:
    """The worker is killed while deltas flow: the last event is an error naming why, no
    ``done`` follows, and the response is left unfinished, so a client that reads only the
    deltas sees a broken transfer, not a short complete stream."""
    srv = Server(engines_root, "--workers", "1")
    try:
        srv.wait_ready(1)
        (victim,) = srv.worker_pids()
        events: list[dict[str, object]] = []
        ended: list[str] = []
        flowing = threading.Event()

        def read() -> None:
            try:
                stream()
            finally:
                flowing.set()  # a failed request must not leave the test waiting

        def stream() -> None:
            data: list[str] = []
            with httpx.Client(base_url=srv.url, timeout=120) as client:
                body = {"model": "tts-1", "voice": "alloy", "input": LONG,
                        "response_format": "pcm", "stream_format": "sse"}  # fmt: skip
                with client.stream("POST", "/v1/audio/speech", json=body) as r:
                    assert r.status_code == 200
                    try:
                        for line in r.iter_lines():
                            if line.startswith("data: "):
                                data.append(line[6:])
                            elif line == "" and data:
                                events.append(json.loads("".join(data)))
                                data = []
                                flowing.set()
                        ended.append("complete")
                    except httpx.RemoteProtocolError:
                        ended.append("incomplete")

        reader = threading.Thread(target=read)
        reader.start()
        assert flowing.wait(timeout=120)
        os.kill(victim, signal.SIGKILL)
        reader.join(timeout=120)
        assert ended == ["incomplete"], (ended, events[-1:])
        *deltas, last = events
        assert deltas and all(e["type"] == "speech.audio.delta" for e in deltas)
        assert last["type"] == "error", last
        error = last["error"]
        assert isinstance(error, dict)
        assert error["type"] == "worker_died" and error["code"] == "worker_died"
        assert error["message"]
        found = wait_until(srv, srv.completions, lambda lines: len(lines) == 1,
                           "its completion line")  # fmt: skip
        assert (found[0]["status"], found[0]["code"]) == ("worker_died", 503)
    finally:
        srv.stop()


def test_usage_counts_frames_of_audio() -> None:
    """The frames of ``output_tokens`` are the audio's duration in the voice's hops, rounded up
    (a pure check of the writer, beside the end-to-end one above)."""
    body = SpeechEventBody(12, FRAMES_PER_S)
    assert body.usage(256 / 22050 * 10) == {"input_tokens": 12, "output_tokens": 10,
                                            "total_tokens": 22}  # fmt: skip
    assert body.usage(1.0)["output_tokens"] == math.ceil(FRAMES_PER_S)
    assert body.audio(b"", None) == b""  # a codec that held its samples: no empty delta
