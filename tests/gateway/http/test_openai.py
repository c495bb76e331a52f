"""``/v1/audio/speech`` and ``/v1/models`` through the official ``openai`` SDK (a client nobody
here wrote), against a real server with API keys, real workers and the real voice."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import soundfile as sf

from tests.audio.decoding import decode, decode_both, rms
from tests.gateway.serving import Server, keyed_server, write_keys
from ttsvc.repository.layout import EngineVersion

TEXT = "Hello from the other side of an OpenAI client."
FORMATS = ["mp3", "opus", "flac", "wav", "pcm"]
MEDIA = {"mp3": "audio/mpeg", "opus": "audio/ogg;codecs=opus", "flac": "audio/flac",
         "wav": "audio/wav", "pcm": "audio/L16;rate=24000"}  # fmt: skip


@pytest.fixture(scope="module")
def keyed(
    default_version: EngineVersion, engines_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, str]]:
    key_file = tmp_path_factory.mktemp("openai-keys") / "keys"
    key = write_keys(key_file, {"sdk-tests": {}})["sdk-tests"]
    with keyed_server(engines_root, key_file, key) as srv:
        yield srv, key


@pytest.fixture(scope="module")
def client(keyed: tuple[Server, str]) -> Iterator[openai.OpenAI]:
    server, key = keyed
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def reference_s(keyed: tuple[Server, str]) -> float:
    """The text's duration from ``/synthesize`` (the same voice and noise, as a WAV)."""
    r = keyed[0].synth(TEXT, stream=False)
    assert r.status_code == 200, r.text
    pcm, rate = decode(r.content, "wav")
    return len(pcm) / rate


def check_audio(data: bytes, fmt: str, reference_s: float) -> None:
    """The whole body reads with ``soundfile.read`` and FFmpeg alike, at the text's length."""
    pcm, rate = decode_both(data, fmt, 24000)
    assert rate == 24000  # OpenAI's rate, for every format
    assert rms(pcm) > 300
    # the voice draws its durations with noise (OpenAI's API has no knob for it): within 20 %,
    # plus MP3's encoder delay and padding
    slack = 0.2 * reference_s + (0.13 if fmt == "mp3" else 0.0)
    assert abs(len(pcm) / rate - reference_s) <= slack, (fmt, len(pcm) / rate, reference_s)


@pytest.mark.parametrize("fmt", FORMATS)
def test_sdk_streams_every_format(client: openai.OpenAI, reference_s: float, fmt: str) -> None:
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=TEXT, response_format=fmt  # type: ignore[arg-type]
    ) as response:
        assert response.headers["content-type"].startswith(MEDIA[fmt])
        pieces = list(response.iter_bytes())
    check_audio(b"".join(pieces), fmt, reference_s)


@pytest.mark.parametrize("fmt", FORMATS)
def test_sdk_whole_files_in_every_format(
    client: openai.OpenAI, reference_s: float, fmt: str
) -> None:
    """Not streamed by the client, and (``stream: false``) sent as one file with exact sizes."""
    response = client.audio.speech.create(
        model="gpt-4o-mini-tts", voice="nova", input=TEXT, response_format=fmt,  # type: ignore[arg-type]
        speed=1.0, extra_body={"stream": False},
    )  # fmt: skip
    check_audio(response.content, fmt, reference_s)


@pytest.mark.parametrize("fmt", FORMATS)
def test_sdk_create_bodies_read_as_files(
    client: openai.OpenAI, reference_s: float, fmt: str
) -> None:
    """What most SDK users write: ``create()`` with no extra fields, then the body handed to
    ``soundfile.read`` (or saved and opened by ffmpeg). FLAC comes whole with its sample count:
    libsndfile reads the "unknown" count of a FLAC stream as an endless file."""
    response = client.audio.speech.create(
        model="tts-1", voice="alloy", input=TEXT, response_format=fmt  # type: ignore[arg-type]
    )
    check_audio(response.content, fmt, reference_s)
    if fmt == "flac":
        assert sf.info(io.BytesIO(response.content)).frames == len(decode(response.content, fmt)[0])
        assert response.response.headers["content-length"] == str(len(response.content))


def test_default_format_is_mp3_and_speed_shortens(
    client: openai.OpenAI, reference_s: float
) -> None:
    response = client.audio.speech.create(model="tts-1", voice="echo", input=TEXT, speed=2.0)
    assert response.response.headers["content-type"] == "audio/mpeg"
    pcm, rate = decode(response.content, "mp3")
    # twice as fast: well under the speed-1 length, not half of it: durations are drawn with
    # noise here (check_audio allows 20 % at equal speed), every phoneme's frame count is
    # rounded up, and mp3 adds its delay and padding (one CI run measured 0.706)
    assert len(pcm) / rate < 0.8 * reference_s


def test_our_own_voice_name_works(client: openai.OpenAI) -> None:
    response = client.audio.speech.create(
        model="tts-1-hd", voice="en_US-joe-medium", input="Mine.", response_format="wav"
    )
    assert decode(response.content, "wav")[1] == 24000


def test_models_are_listed(client: openai.OpenAI) -> None:
    ids = [m.id for m in client.models.list()]
    assert {"tts-1", "tts-1-hd", "gpt-4o-mini-tts"} <= set(ids)
    assert client.models.retrieve("tts-1").owned_by == "ttsvc"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("dall-e-3")


@pytest.mark.parametrize(
    ("kwargs", "error", "param", "err_type"),
    [
        ({"response_format": "aac"}, openai.UnprocessableEntityError, "response_format",
         "format_unavailable"),
        ({"voice": "nobody"}, openai.NotFoundError, "voice", "unknown_voice"),
        ({"model": "whisper-1"}, openai.NotFoundError, "model", "unknown_model"),
        ({"input": "a" * 4097}, openai.UnprocessableEntityError, "input", "invalid_parameter"),
        ({"speed": 4.5}, openai.UnprocessableEntityError, "speed", "invalid_parameter"),
        ({"speed": 0.2}, openai.UnprocessableEntityError, "speed", "invalid_parameter"),
        ({"stream_format": "chunks"}, openai.UnprocessableEntityError, "stream_format",
         "invalid_parameter"),
        ({"response_format": "flac", "extra_body": {"stream": True}},
         openai.UnprocessableEntityError, "stream", "invalid_parameter"),
    ],
)  # fmt: skip
def test_errors_reach_the_sdk_in_openai_shape(
    client: openai.OpenAI,
    kwargs: dict[str, object],
    error: type[openai.APIStatusError],
    param: str,
    err_type: str,
) -> None:
    args: dict[str, object] = {"model": "tts-1", "voice": "alloy", "input": "Hi.", **kwargs}
    with pytest.raises(error) as raised:
        client.audio.speech.create(**args)  # type: ignore[arg-type]
    body = raised.value.body
    assert isinstance(body, dict)
    assert body["type"] == err_type and body["param"] == param and body["message"]


@pytest.mark.parametrize("text", ["   ", "...", "\U0001f642", "\U0001f642 " * 200])
@pytest.mark.parametrize("fmt", ["pcm", "wav", "mp3", "opus"])
def test_nothing_to_say_is_a_short_silence_and_a_200(
    client: openai.OpenAI, keyed: tuple[Server, str], text: str, fmt: str
) -> None:
    """An agent's reply with nothing speakable (blank, "...", an emoji) is 50 ms of silence at
    OpenAI's rate, not an error (Pipecat logs a 422 as a failed turn, LiveKit closes a session
    after three) nor a body without audio (LiveKit retries it into "no audio frames were
    pushed"). The gateway knows the short ones at once, the worker the long one: alike."""
    server, _ = keyed
    before = server.completions()
    audio = client.audio.speech.create(model="tts-1", voice="alloy", input=text,
                                       response_format=fmt)  # type: ignore[arg-type]  # fmt: skip
    assert audio.response.headers["x-empty-text"] == "true"
    pcm, rate = decode(audio.read(), fmt, 24000)
    assert rate == 24000 and rms(pcm) < 30
    assert 0.04 <= len(pcm) / rate <= 0.05 + (0.15 if fmt == "mp3" else 0.01), len(pcm) / rate
    (line,) = server.completions()[len(before):]
    assert (line["code"], line["status"], line["audio_s"]) == (200, "empty_text", 0.05)
    assert line["uid"] == audio.response.headers["x-request-id"]


def test_nothing_to_say_in_speech_events_is_a_delta_of_silence_then_done(
    keyed: tuple[Server, str],
) -> None:
    server, key = keyed
    r = httpx.post(f"{server.url}/v1/audio/speech", headers={"authorization": f"Bearer {key}"},
                   json={"model": "gpt-4o-mini-tts", "voice": "alloy", "input": "\U0001f642",
                         "response_format": "pcm", "stream_format": "sse"},
                   timeout=30)  # fmt: skip
    assert r.status_code == 200 and r.headers["x-empty-text"] == "true", r.text
    events = [json.loads(line[len("data: "):]) for line in r.text.splitlines() if line]
    assert [e["type"] for e in events] == ["speech.audio.delta", "speech.audio.done"]
    assert base64.b64decode(events[0]["audio"]) == bytes(2 * round(0.05 * 24000))


def test_empty_text_error_asks_for_the_422(client: openai.OpenAI) -> None:
    """The field is ours: the SDK sends it in ``extra_body``."""
    with pytest.raises(openai.UnprocessableEntityError) as raised:
        client.audio.speech.create(model="tts-1", voice="alloy", input="\U0001f642",
                                   extra_body={"empty_text": "error"})  # fmt: skip
    body = raised.value.body
    assert isinstance(body, dict) and (body["type"], body["param"]) == ("empty_text", "input")


def test_a_wrong_key_is_an_authentication_error(keyed: tuple[Server, str]) -> None:
    server, _ = keyed
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-wrong", max_retries=0) as c:
        with pytest.raises(openai.AuthenticationError) as raised:
            c.audio.speech.create(model="tts-1", voice="alloy", input="Hi.")
    assert raised.value.response.headers["www-authenticate"].startswith("Bearer")
