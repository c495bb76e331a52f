"""``POST /synthesize/with-timestamps`` on a real `ttsvc serve`: base64 audio and word times in one
stream (JSON lines or SSE), the same audio ``/synthesize`` sends, the same accounting, and a 409
naming ``voice`` for engines compiled before they had phoneme durations."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.engine_files import without_durations
from tests.gateway.serving import Server
from ttsvc.repository.layout import EngineVersion

PATH = "/synthesize/with-timestamps"
TEXT = "It costs $12.50 today. Red, green and blue!"
STILL = {"noise_scale": 0.0, "noise_w": 0.0}
RATE = 22050


@pytest.fixture(scope="module")
def server(default_version: EngineVersion, engines_root: Path) -> Iterator[Server]:
    srv = Server(engines_root, "--workers", "1")
    srv.wait_ready(1)
    yield srv
    srv.stop()


def lines(response: httpx.Response) -> list[dict[str, object]]:
    body = response.text
    if response.headers["content-type"].startswith("text/event-stream"):
        events = [e for e in body.split("\n\n") if e]
        assert all(e.startswith("data: ") for e in events)
        return [json.loads(e.removeprefix("data: ")) for e in events]
    assert body.endswith("\n")
    return [json.loads(line) for line in body.splitlines()]


def chunks_and_words(
    parsed: list[dict[str, object]],
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    *chunks, done = parsed
    assert done["done"] is True
    words = [w for c in chunks for w in c["words"]]  # type: ignore[attr-defined]
    return chunks, words


def test_lines_carry_the_audio_of_synthesize_and_its_words(server: Server) -> None:
    r = server.client.post(PATH, json={"text": TEXT, **STILL})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/x-ndjson"
    assert r.headers["x-sample-rate"] == str(RATE)
    chunks, words = chunks_and_words(lines(r))
    audio = b"".join(base64.b64decode(str(c["audio"])) for c in chunks)
    plain = server.synth(TEXT, format="pcm", **STILL)
    assert plain.status_code == 200
    assert audio == plain.content  # the same stream, only framed with its words
    assert [w["word"] for w in words] == [
        "It", "costs", "twelve", "dollars", "and", "fifty", "cents", "today", "Red", "green",
        "and", "blue",
    ]  # fmt: skip
    assert {TEXT[slice(*w["text_span"])] for w in words[2:7]} == {"$12.50"}  # type: ignore[misc]
    assert [TEXT[slice(*w["text_span"])] for w in words[-4:]] == ["Red", "green", "and", "blue"]  # type: ignore[misc]
    sent = 0
    for chunk in chunks:  # offsets in seconds match the audio before them, words their chunk
        assert chunk["offset_s"] == pytest.approx(sent / 2 / RATE, abs=1e-6)
        size = len(base64.b64decode(str(chunk["audio"])))
        for word in chunk["words"]:  # type: ignore[attr-defined]
            assert sent / 2 / RATE - 1e-6 <= word["start"] < (sent + size) / 2 / RATE
            assert word["start"] < word["end"]
        sent += size


def test_sse_and_another_rate_keep_the_times(server: Server) -> None:
    """Times are seconds of the utterance: resampled to 16 kHz, they do not move."""
    native_chunks, native = chunks_and_words(
        lines(server.client.post(PATH, json={"text": TEXT, **STILL}))
    )
    native_s = sum(len(base64.b64decode(str(c["audio"]))) for c in native_chunks) / 2 / RATE
    r = server.client.post(PATH, json={"text": TEXT, "stream_format": "sse", "sample_rate": 16000,
                                       **STILL})  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    chunks, words = chunks_and_words(lines(r))
    assert words == native
    audio = b"".join(base64.b64decode(str(c["audio"])) for c in chunks)
    assert len(audio) / 2 / 16000 == pytest.approx(native_s, abs=0.002)
    assert [c["offset_s"] for c in chunks] == [c["offset_s"] for c in native_chunks]


def test_whole_file_requests_are_refused_on_the_field(server: Server) -> None:
    r = server.client.post(PATH, json={"text": TEXT, "format": "flac"})
    assert (r.status_code, r.json()["field"]) == (422, "format")
    r = server.client.post(PATH, json={"text": TEXT, "stream": False})
    assert (r.status_code, r.json()["field"]) == (422, "stream")
    # before the voice is looked up (nor waited for): the field, not an unknown voice
    r = server.client.post(PATH, json={"text": TEXT, "format": "flac", "voice": "nobody"})
    assert (r.status_code, r.json()["field"]) == (422, "format")


def test_counted_like_synthesize(server: Server) -> None:
    assert server.client.post(PATH, json={"text": "Hello."}).status_code == 200
    server.wait_idle()
    done = [json.loads(x) for x in server.log_lines() if '"event": "request"' in x]
    assert any(d["status"] == "ok" and d["format"] == "pcm" and d["audio_s"] for d in done)
    text = httpx.get(server.metrics_url, timeout=10).text
    assert re.search(r'ttsvc_format_requests_total{api="timestamps",format="pcm"} [1-9]', text)


def test_engines_without_durations_answer_409_and_still_serve_audio(
    default_version: EngineVersion, tmp_path: Path
) -> None:
    root = tmp_path / "engines"
    voice = default_version.path.parent.name
    without_durations(default_version.path, root / voice / "1")
    srv = Server(root, "--workers", "1")
    try:
        srv.wait_ready(1)
        r = srv.client.post(PATH, json={"text": TEXT})
        assert r.status_code == 409, r.text
        body = r.json()
        assert (body["type"], body["field"]) == ("timestamps_unavailable", "voice")
        assert "recompile" in body["error"]
        r = srv.client.post("/v1/audio/speech", json={
            "model": "tts-1", "voice": "alloy", "input": TEXT, "stream_format": "sse",
            "timestamps": True})  # fmt: skip
        assert (r.status_code, r.json()["error"]["code"]) == (409, "timestamps_unavailable")
        assert srv.synth(TEXT, format="pcm").status_code == 200
    finally:
        srv.stop()


def test_openai_speech_events_carry_the_same_words_when_asked(server: Server) -> None:
    """``timestamps`` on /v1/audio/speech with ``stream_format: "sse"``: each delta carries its
    offset and words, the words of /synthesize/with-timestamps (times are seconds, so 24 kHz
    does not move them); without sse the field is refused."""
    _, expected = chunks_and_words(lines(server.client.post(PATH, json={"text": TEXT, **STILL})))
    body = {"model": "tts-1", "voice": "alloy", "input": TEXT, "response_format": "pcm",
            "stream_format": "sse", "timestamps": True}  # fmt: skip
    r = server.client.post("/v1/audio/speech", json=body)
    assert r.status_code == 200, r.text
    *deltas, done = lines(r)
    assert done["type"] == "speech.audio.done"
    assert all(d["type"] == "speech.audio.delta" and "offset_s" in d for d in deltas)
    words = [w for d in deltas for w in d["words"]]  # type: ignore[attr-defined]
    # OpenAI's speech has no noise settings (durations vary): the words and spans match, and
    # each word starts inside the delta that carries it
    assert [(w["word"], w["text_span"]) for w in words] == [
        (w["word"], w["text_span"]) for w in expected]  # fmt: skip
    # offsets are where each chunk starts in the utterance (the resampler's bytes lag them)
    offsets = [float(d["offset_s"]) for d in deltas] + [float("inf")]  # type: ignore[arg-type]
    assert offsets == sorted(offsets) and offsets[0] == 0.0
    for delta, begin, end in zip(deltas, offsets, offsets[1:], strict=False):
        for word in delta["words"]:  # type: ignore[attr-defined]
            assert begin <= word["start"] < end
    r = server.client.post("/v1/audio/speech", json={**body, "stream_format": "audio"})
    assert (r.status_code, r.json()["error"]["param"]) == (422, "timestamps")


@pytest.mark.parametrize("stream_format", ["jsonl", "sse"])
def test_nothing_to_speak_is_a_line_of_silence_with_no_words_then_done(
    server: Server, stream_format: str
) -> None:
    r = server.client.post(PATH, json={"text": "\U0001f642", "sample_rate": 16000,
                                       "stream_format": stream_format})  # fmt: skip
    assert r.status_code == 200 and r.headers["x-empty-text"] == "true", r.text
    first, last = lines(r)
    assert base64.b64decode(str(first["audio"])) == bytes(2 * round(0.05 * 16000))
    assert first["words"] == [] and last == {"done": True, "audio_s": 0.05}
    r = server.client.post(PATH, json={"text": "\U0001f642", "empty_text": "error"})
    assert r.status_code == 422 and r.json()["type"] == "empty_text", r.text
