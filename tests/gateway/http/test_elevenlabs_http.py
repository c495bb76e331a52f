"""ElevenLabs' HTTP text-to-speech routes against a real ``ttsvc serve`` with keys on.

Pipecat's ``ElevenLabsHttpTTSService``, unchanged but for its base URL, must get audio and word
times from ``/stream/with-timestamps``. Raw requests check the rest: the plain routes' audio
(MP3, PCM, µ-law at the rate asked, as long as ``/synthesize``'s), the timestamped lines'
characters (the request text, times that never go back and end within the audio), speed,
nothing to say, and the refusals (recorded like every synthesis request's).
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import httpx
import numpy as np
import pytest

from tests.audio.decoding import decode, rms
from tests.gateway.serving import Server, metric
from tests.gateway.test_agent_clients import SLACK, needs

VOICE = "en_US-joe-medium"
TEXT = "Hello from a voice agent. The framework plays what ttsvc streams back."
RATE = 24000
pytestmark = [  # Pipecat's own modules use what it (and Python) deprecated: not ours to fix
    pytest.mark.filterwarnings("ignore:`AudioContextTTSService` is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:'audioop' is deprecated:DeprecationWarning"),
]


@pytest.fixture(scope="module")
def server(keyed: Server) -> Server:
    """The module's server has keys on (``keyed``)."""
    return keyed


@pytest.fixture(scope="module")
def reference_s(server: Server) -> float:
    """TEXT's duration from /synthesize."""
    r = server.synth(TEXT, stream=False, format="pcm", sample_rate=RATE)
    assert r.status_code == 200, r.text
    return len(r.content) / 2 / RATE


def post(server: Server, key: str, route: str, body: dict[str, Any], voice: str = VOICE,
         **query: str) -> httpx.Response:  # fmt: skip
    """A request as ElevenLabs' clients make it: the key as ``xi-api-key``, nothing else."""
    return httpx.post(f"{server.url}/v1/text-to-speech/{voice}{route}", json=body,
                      params={"model_id": "eleven_flash_v2_5", **query},
                      headers={"xi-api-key": key}, timeout=120)  # fmt: skip


def requests_made(server: Server, fmt: str) -> float:
    return metric(server, "ttsvc_format_requests_total", format=fmt, api="elevenlabs")


def refused(server: Server, code: int, outcome: str) -> float:
    return metric(server, "ttsvc_requests_total", code=str(code), outcome=outcome)


def check_alignment(alignment: dict[str, Any], text: str, audio_s: float) -> None:
    """``alignment``'s characters are ``text``; times never go back and end within the audio."""
    chars = alignment["characters"]
    starts = alignment["character_start_times_seconds"]
    ends = alignment["character_end_times_seconds"]
    assert "".join(chars) == text
    assert len(starts) == len(ends) == len(chars)
    assert all(e >= s for s, e in zip(starts, ends, strict=True))
    assert all(b >= a for a, b in zip(ends, starts[1:], strict=False)), "times go back"
    assert starts[0] >= 0 and ends[-1] <= audio_s + 0.001
    second = text.index("The")
    assert starts[second] > starts[second - 2] + 0.2, "no pause between the sentences"


@needs("pipecat-ai")
def test_pipecat_elevenlabs_http_service_speaks_with_word_times(
    server: Server, key: str, reference_s: float
) -> None:
    """Pipecat's HTTP class as a pipeline drives it: each sentence one POST to
    ``/stream/with-timestamps``, its NDJSON lines' audio played and their alignment turned into
    word times on a clock that runs on from one sentence to the next."""
    import aiohttp  # noqa: PLC0415
    from pipecat.frames.frames import (  # noqa: PLC0415
        ErrorFrame,
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
        TTSAudioRawFrame,
        TTSTextFrame,
    )
    from pipecat.pipeline.worker import PipelineParams  # noqa: PLC0415
    from pipecat.services.elevenlabs.tts import ElevenLabsHttpTTSService  # noqa: PLC0415
    from pipecat.tests.utils import run_test  # noqa: PLC0415

    before = requests_made(server, "pcm")
    frames = [LLMFullResponseStartFrame(), *(LLMTextFrame(t + " ") for t in TEXT.split()),
              LLMFullResponseEndFrame()]  # fmt: skip

    async def synthesize() -> list[Any]:
        async with aiohttp.ClientSession() as session:
            tts = ElevenLabsHttpTTSService(api_key=key, aiohttp_session=session,
                                           base_url=server.url,
                                           settings=ElevenLabsHttpTTSService.Settings(
                                               voice=VOICE))  # fmt: skip
            down, _ = await run_test(tts, frames_to_send=frames,
                                     pipeline_params=PipelineParams(audio_out_sample_rate=RATE))
        return list(down)

    down = asyncio.run(synthesize())
    assert not [f for f in down if isinstance(f, ErrorFrame)]
    audio = [f for f in down if isinstance(f, TTSAudioRawFrame)]
    assert audio and {f.sample_rate for f in audio} == {RATE}
    pcm = np.frombuffer(b"".join(f.audio for f in audio), "<i2")
    assert rms(pcm) > 300, "silence"
    # two requests, without the pause /synthesize puts between the sentences: a little shorter
    assert abs(len(pcm) / RATE - reference_s) <= SLACK * reference_s, (len(pcm) / RATE,
                                                                       reference_s)  # fmt: skip
    assert requests_made(server, "pcm") == before + 2  # one request per sentence
    words = [f for f in down if isinstance(f, TTSTextFrame)]
    assert [w.text for w in words] == TEXT.split()
    at = [(w.pts - words[0].pts) / 1e9 for w in words]  # type: ignore[operator]
    assert at == sorted(at) and at[-1] < len(pcm) / RATE
    # the clock runs on by the first request's audio (its last character's end): the second
    # sentence's first word comes about where that audio ends
    first = post(server, key, "", {"text": TEXT[:TEXT.index("The")]}, output_format="pcm_24000")
    first_s = len(first.content) / 2 / RATE
    second = TEXT.split().index("The")
    assert (1 - SLACK) * first_s - 0.3 <= at[second] <= (1 + SLACK) * first_s + 0.3, (at, first_s)


@pytest.mark.parametrize(
    ("route", "output_format", "fmt", "rate", "media"),
    [("", None, "mp3", 44100, "audio/mpeg"), ("/stream", "mp3_22050_32", "mp3", 22050,
                                              "audio/mpeg"),
     ("", "pcm_16000", "pcm", 16000, None), ("/stream", "pcm_24000", "pcm", 24000, None),
     ("/stream", "ulaw_8000", "mulaw", 8000, None)],
)  # fmt: skip
def test_plain_routes_return_audio_of_the_format_rate_and_length(
    server: Server, key: str, reference_s: float, route: str, output_format: str | None,
    fmt: str, rate: int, media: str | None,
) -> None:  # fmt: skip
    before = requests_made(server, fmt)
    query = {} if output_format is None else {"output_format": output_format}
    r = post(server, key, route, {"text": TEXT, "voice_settings": {"stability": 0.5}}, **query)
    assert r.status_code == 200, r.text
    assert r.headers["x-sample-rate"] == str(rate)
    if media is not None:
        assert r.headers["content-type"].startswith(media)
    pcm, got = decode(r.content, fmt, rate)
    assert got == rate and rms(pcm) > 300
    assert abs(len(pcm) / rate - reference_s) <= SLACK * reference_s, (len(pcm) / rate,
                                                                       reference_s)  # fmt: skip
    assert requests_made(server, fmt) == before + 1


def test_voice_settings_speed_is_applied(server: Server, key: str, reference_s: float) -> None:
    """As ``speed`` on /synthesize (the pauses between sentences keep their length)."""
    fast = server.synth(TEXT, stream=False, format="pcm", sample_rate=RATE, speed=2.0)
    fast_ref = len(fast.content) / 2 / RATE
    assert fast_ref < 0.8 * reference_s
    r = post(server, key, "", {"text": TEXT, "voice_settings": {"speed": 2.0, "style": 0.3}},
             output_format=f"pcm_{RATE}")  # fmt: skip
    assert r.status_code == 200, r.text
    fast_s = len(r.content) / 2 / RATE
    assert abs(fast_s - fast_ref) <= SLACK * fast_ref, (fast_s, fast_ref, reference_s)


def test_stream_with_timestamps_lines_carry_audio_and_the_text_in_time(
    server: Server, key: str, reference_s: float
) -> None:
    r = post(server, key, "/stream/with-timestamps",
             {"text": TEXT, "previous_text": "ignored", "seed": 3, "unknown": 1},
             output_format=f"pcm_{RATE}")  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in r.text.splitlines()]
    assert len(lines) > 1, "one line per piece of audio"
    audio = b""
    chars: dict[str, list[Any]] = {"characters": [], "character_start_times_seconds": [],
                                   "character_end_times_seconds": []}  # fmt: skip
    for line in lines:
        audio += base64.b64decode(line["audio_base64"])
        assert line["normalized_alignment"] == line["alignment"]
        if line["alignment"] is not None:
            # each character starts within the audio sent up to its line
            assert line["alignment"]["character_start_times_seconds"][-1] <= len(audio) / 2 / RATE
            for name, values in line["alignment"].items():
                chars[name] += values
    audio_s = len(audio) / 2 / RATE
    assert abs(audio_s - reference_s) <= SLACK * reference_s, (audio_s, reference_s)
    check_alignment(chars, TEXT, audio_s)


def test_with_timestamps_is_one_object_of_the_whole(server: Server, key: str) -> None:
    r = post(server, key, "/with-timestamps", {"text": TEXT}, output_format="mp3_24000_48")
    assert r.status_code == 200, r.text
    body = r.json()
    pcm, rate = decode(base64.b64decode(body["audio_base64"]), "mp3")
    assert rate == RATE and rms(pcm) > 300
    assert body["normalized_alignment"] == body["alignment"]
    check_alignment(body["alignment"], TEXT, len(pcm) / rate)


def test_enable_ssml_parsing_reads_inline_tags_and_aligns_the_text_sent(
    server: Server, key: str
) -> None:
    """``enable_ssml_parsing=true`` (ElevenLabs' query parameter): the text is SSML with inline
    tags, no ``<speak>`` (as ElevenLabs takes it); the break is silence, and the alignment
    still places the characters sent. Without it the text is read as before."""
    plain = "Hello there. Goodbye now."
    marked = 'Hello there. <break time="2s"/> Goodbye now.'
    base = post(server, key, "/stream", {"text": plain}, output_format=f"pcm_{RATE}")
    r = post(server, key, "/with-timestamps", {"text": marked}, output_format=f"pcm_{RATE}",
             enable_ssml_parsing="true")  # fmt: skip
    assert base.status_code == r.status_code == 200, r.text
    body = r.json()
    audio = base64.b64decode(body["audio_base64"])
    added = (len(audio) - len(base.content)) / 2 / RATE
    assert 1.6 < added < 2.6, added  # the break, give or take the voice's own variation
    assert "".join(body["alignment"]["characters"]) == marked
    # a bare "&" is plain text's, and markup's error: the flag alone decides which it is
    text = {"text": "Tom & Jerry."}
    assert post(server, key, "", text, output_format=f"pcm_{RATE}").status_code == 200
    bad = post(server, key, "", text, output_format=f"pcm_{RATE}", enable_ssml_parsing="true")
    assert bad.status_code == 422 and bad.json()["type"] == "invalid_ssml", bad.text
    assert post(server, key, "", text, output_format=f"pcm_{RATE}",
                enable_ssml_parsing="false").status_code == 200  # fmt: skip


@pytest.mark.parametrize("route", ["", "/stream", "/stream/with-timestamps", "/with-timestamps"])
@pytest.mark.parametrize("text", ["  ", "\U0001f642"])
def test_nothing_to_say_is_a_short_silence(server: Server, key: str, route: str,
                                           text: str) -> None:  # fmt: skip
    """50 ms of zeros in the output format asked for (the aligned routes carry it in their
    line), ``X-Empty-Text``, recorded 200 ``empty_text``."""
    before = metric(server, "ttsvc_requests_total", code="200", outcome="empty_text")
    r = post(server, key, route, {"text": text}, output_format="pcm_16000")
    assert r.status_code == 200, r.text
    assert r.headers["x-empty-text"] == "true"
    if route.endswith("with-timestamps"):
        lines = [json.loads(line) for line in r.text.splitlines() if line]
        audio = b"".join(base64.b64decode(line["audio_base64"]) for line in lines)
    else:
        audio = r.content
    assert audio == bytes(2 * round(0.05 * 16000))
    assert metric(server, "ttsvc_requests_total", code="200",
                  outcome="empty_text") == before + 1  # fmt: skip


def test_nothing_to_say_is_a_short_silence_in_mp3(server: Server, key: str) -> None:
    r = post(server, key, "/stream", {"text": "\U0001f642"})  # unset: mp3_44100_128
    assert r.status_code == 200 and r.headers["x-empty-text"] == "true", r.text
    pcm, rate = decode(r.content, "mp3")
    assert rate == 44100 and 0.04 <= len(pcm) / rate <= 0.2 and rms(pcm) < 30


def test_empty_text_error_in_the_body_asks_for_the_422(server: Server, key: str) -> None:
    r = post(server, key, "/stream", {"text": "\U0001f642", "empty_text": "error"})
    assert r.status_code == 422 and r.json()["type"] == "empty_text", r.text


def test_refusals_are_answered_and_recorded(server: Server, key: str) -> None:
    unauthorized = refused(server, 401, "unauthorized")
    for headers in ({}, {"xi-api-key": "nope"}):
        r = httpx.post(f"{server.url}/v1/text-to-speech/{VOICE}/stream", json={"text": TEXT},
                       headers=headers, timeout=30)  # fmt: skip
        assert r.status_code == 401 and r.json()["type"] == "unauthorized", r.text
    assert refused(server, 401, "unauthorized") == unauthorized + 2
    unknown = refused(server, 404, "unknown_voice")
    r = post(server, key, "/stream/with-timestamps", {"text": TEXT}, voice="nobody")
    assert r.status_code == 404 and r.json()["type"] == "unknown_voice" and VOICE in r.text
    assert refused(server, 404, "unknown_voice") == unknown + 1
    invalid = refused(server, 422, "invalid_parameter")
    for bad in ("opus_48000_64", "pcm_32000", "alaw_8000"):
        r = post(server, key, "/stream", {"text": TEXT}, output_format=bad)
        assert r.status_code == 422, r.text
        assert r.json()["field"] == "output_format" and bad in r.text
    # refused on its field before the voice is looked up (nor waited for)
    r = post(server, key, "/stream", {"text": TEXT}, voice="nobody", output_format="alaw_8000")
    assert r.status_code == 422 and r.json()["field"] == "output_format", r.text
    r = post(server, key, "", {"text": TEXT, "voice_settings": {"speed": 9}})
    assert r.status_code == 422 and r.json()["field"] == "voice_settings.speed"
    r = post(server, key, "", {"model_id": "eleven_flash_v2_5"})  # ttsvc's shape: no renaming
    assert r.status_code == 422 and r.json()["field"] == "text"
    assert refused(server, 422, "invalid_parameter") == invalid + 6
