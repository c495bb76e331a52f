"""Output formats and rates on ``POST /synthesize``: a real server, real workers, the real voice.
Every whole response body is read back as clients read it, by ``soundfile.read`` and by FFmpeg."""

from __future__ import annotations

import io

import httpx
import numpy as np
import pytest
import soundfile as sf

from tests.audio.decoding import decode, decode_both, decode_prefix, rms, ulaw_to_pcm
from tests.gateway.serving import Server
from ttsvc.audio.encode import FORMATS

DET = {"noise_scale": 0.0, "noise_w": 0.0}
TEXT = "Every format carries the same sentence."
CASES = [(name, rate) for name, fmt in FORMATS.items() for rate in fmt.rates]
STREAMING = [name for name, fmt in FORMATS.items() if fmt.streams]
MEDIA = {"wav": "audio/wav", "pcm": "audio/L16", "mulaw": "audio/basic", "mp3": "audio/mpeg",
         "opus": "audio/ogg;codecs=opus", "flac": "audio/flac"}  # fmt: skip


@pytest.fixture(scope="module")
def reference_s(server: Server) -> float:
    """The sentence's duration from the native-rate WAV, the length every format must match."""
    r = server.synth(TEXT, stream=False, **DET)
    assert r.status_code == 200, r.text
    pcm, rate = decode(r.content, "wav")
    return len(pcm) / rate


def slack_s(name: str, rate: int) -> float:
    """Resampling edges, plus for MP3 LAME's delay, padding and the streamed Info frame."""
    frame = 1152 if rate >= 32000 else 576
    return 0.01 + ((1105 + 3 * frame) / rate if name == "mp3" else 0.0)


@pytest.mark.parametrize(("name", "rate"), CASES)
def test_every_format_and_rate_decodes(
    server: Server, reference_s: float, name: str, rate: int
) -> None:
    r = server.synth(TEXT, format=name, sample_rate=rate, **DET)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith(MEDIA[name])
    assert r.headers["x-sample-rate"] == str(rate)
    # streamed unless the format is whole-only: chunked, no length known up front
    assert ("content-length" in r.headers) == (not FORMATS[name].streams)
    pcm, got_rate = decode_both(r.content, name, rate)
    assert got_rate == rate
    if name == "wav":  # streamed: sizes that mean "to the end", read so by both decoders
        assert r.content[4:8] == r.content[40:44] == b"\xff\xff\xff\xff"
    if name == "flac":  # whole: the sample count readers size their buffers by
        assert sf.info(io.BytesIO(r.content)).frames == len(pcm)
    assert np.all(np.isfinite(pcm.astype(np.float64)))
    assert rms(pcm) > 300, "silent"
    duration = len(pcm) / rate
    assert reference_s - 0.01 <= duration <= reference_s + slack_s(name, rate), duration


@pytest.mark.parametrize("name", list(FORMATS))
def test_whole_files_match_streams(server: Server, reference_s: float, name: str) -> None:
    rate = FORMATS[name].default_rate or 22050
    r = server.synth(TEXT, format=name, stream=False, **DET)
    assert r.status_code == 200, r.text
    assert r.headers["x-sample-rate"] == str(rate)
    pcm, got_rate = decode_both(r.content, name, rate)
    assert got_rate == rate and rms(pcm) > 300
    assert abs(len(pcm) / rate - reference_s) <= slack_s(name, rate)
    if name in ("wav", "pcm", "flac"):  # lossless: the same samples as the default response
        streamed, _ = decode(server.synth(TEXT, format=name, **DET).content, name, rate)
        assert np.array_equal(pcm, streamed)


def test_flac_refuses_to_stream(server: Server) -> None:
    """A FLAC stream's header would carry an unknown sample count, which ``soundfile.read``
    cannot read: asked to stream, FLAC says so and names the formats that do."""
    r = server.synth("hi", format="flac", stream=True)
    assert r.status_code == 422
    body = r.json()
    assert body["field"] == "stream" and body["type"] == "invalid_parameter"
    assert all(name in body["error"] for name in STREAMING)


def test_mulaw_round_trips_the_8khz_pcm(server: Server) -> None:
    """µ-law (defaulting to 8 kHz) expands to the 8 kHz PCM within µ-law's quantization."""
    mulaw = server.synth(TEXT, format="mulaw", **DET)
    assert mulaw.headers["x-sample-rate"] == "8000"
    pcm = server.synth(TEXT, format="pcm", sample_rate=8000, **DET)
    linear = np.frombuffer(pcm.content, "<i2").astype(np.int32)
    expanded = ulaw_to_pcm(mulaw.content).astype(np.int32)
    assert len(mulaw.content) == len(linear)  # one byte per sample, no header
    # a worker's windows may round a sample one step apart between two requests
    assert np.all(np.abs(expanded - linear) <= np.abs(linear) // 16 + 17)
    assert rms(ulaw_to_pcm(mulaw.content)) > 300


@pytest.mark.parametrize("name", STREAMING)
def test_a_client_stopping_midway_holds_a_valid_stream(server: Server, name: str) -> None:
    text = "A listener hangs up halfway through this rather long answer. " * 6
    rate = FORMATS[name].default_rate or 22050
    received = b""
    with httpx.Client(base_url=server.url, timeout=120) as client:
        with client.stream("POST", "/synthesize",
                           json={"text": text, "format": name, **DET}) as r:  # fmt: skip
            assert r.status_code == 200
            for piece in r.iter_raw():
                received += piece
                if len(received) > 6000:
                    break  # hang up mid-stream
    pcm, got_rate = decode_prefix(received, name, rate)
    assert got_rate == rate and len(pcm) > 0 and rms(pcm) > 100
    server.wait_idle()  # the gateway noticed, cancelled the stream and freed its slot


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"format": "opus", "sample_rate": 22050}, "Opus"),
        ({"format": "opus", "sample_rate": 44100}, "Opus"),
        ({"format": "mulaw", "sample_rate": 16000}, "8 kHz"),
    ],
)
def test_rates_a_codec_cannot_take_are_refused(
    server: Server, body: dict[str, object], message: str
) -> None:
    r = server.synth("hi", **body)
    assert r.status_code == 422
    assert r.json()["field"] == "sample_rate" and message in r.json()["error"]


def test_completion_log_names_the_format(server: Server) -> None:
    r = server.synth("Logged as flac.", format="flac")
    uid = r.headers["x-request-id"]
    line = next(ln for ln in server.log_lines() if uid in ln and '"event": "request"' in ln)
    assert '"format": "flac"' in line and '"key": null' in line


def test_cors_is_off_unless_origins_are_configured(server: Server) -> None:
    preflight = server.client.options("/synthesize", headers={
        "Origin": "https://app.example.com", "Access-Control-Request-Method": "POST"})  # fmt: skip
    assert "access-control-allow-origin" not in preflight.headers
    r = server.synth("hi", format="pcm")
    assert "access-control-allow-origin" not in r.headers


@pytest.mark.parametrize(("name", "rate"), CASES)
def test_nothing_to_speak_is_a_short_silence_in_every_format_and_rate(
    server: Server, name: str, rate: int
) -> None:
    """An emoji (Pipecat's Piper client posts each sentence here): 50 ms of zeros in the format
    and rate asked for, a container both decoders read, said in ``X-Empty-Text`` and recorded
    ``empty_text`` with a 200."""
    before = len(server.completions())
    r = server.synth("\U0001f642", format=name, sample_rate=rate)
    assert r.status_code == 200, r.text
    assert r.headers["x-empty-text"] == "true" and r.headers["x-sample-rate"] == str(rate)
    assert r.headers["content-type"].startswith(MEDIA[name])
    pcm, got_rate = decode_both(r.content, name, rate)
    assert got_rate == rate and rms(pcm) < 30
    assert 0.05 - 0.01 <= len(pcm) / rate <= 0.05 + slack_s(name, rate), len(pcm) / rate
    (line,) = server.completions()[before:]
    assert (line["status"], line["code"], line["format"]) == ("empty_text", 200, name)
    assert line["uid"] == r.headers["x-request-id"]


def test_empty_text_error_keeps_the_422_and_other_values_are_refused(server: Server) -> None:
    for text in ("   ", "\U0001f642", "\U0001f642 " * 200):  # the last is judged by its worker
        r = server.synth(text, empty_text="error")
        assert r.status_code == 422 and r.json()["type"] == "empty_text", r.text
        assert r.json()["field"] == "text"
    r = server.synth("\U0001f642", empty_text="quiet")
    assert r.status_code == 422 and r.json()["field"] == "empty_text", r.text


def test_a_text_only_its_worker_finds_empty_is_a_short_silence_too(server: Server) -> None:
    """Too long to be normalized on the gateway's loop: its worker says there is nothing to
    speak before any audio, and the answer is the same silence."""
    before = len(server.completions())
    r = server.synth("\U0001f642 " * 200, format="wav", stream=False)
    assert r.status_code == 200 and r.headers["x-empty-text"] == "true", r.text
    pcm, rate = decode(r.content, "wav")
    assert len(pcm) == round(0.05 * rate) and not pcm.any()
    (line,) = server.completions()[before:]
    assert (line["status"], line["code"]) == ("empty_text", 200) and line["worker"] is not None
