"""Voice-agent frameworks' own TTS classes against a real server: LiveKit Agents'
``livekit.plugins.openai.TTS(base_url=...)`` and Pipecat's ``OpenAITTSService`` and
``PiperHttpTTSService``, installed from PyPI (the ``clients`` extra, which CI installs), each
driven as its framework drives it and checked for real audio: samples, loudness, duration.

Skipped, saying so, where the extra is not installed.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from tests.audio.decoding import decode, rms
from tests.gateway.serving import Server, wait_until

TEXT = "Hello from a voice agent. The framework plays what ttsvc streams back."
pytestmark = [  # Pipecat's own modules use what it (and Python) deprecated: not ours to fix
    pytest.mark.filterwarnings("ignore:`AudioContextTTSService` is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:'audioop' is deprecated:DeprecationWarning"),
]
SLACK = 0.2
"""The voice draws its durations with noise (these clients have no knob for it): within 20 %."""


def needs(distribution: str) -> pytest.MarkDecorator:
    """Skip (before any server starts, importing nothing) where ``distribution`` is not
    installed."""
    try:
        importlib.metadata.distribution(distribution)
        missing = False
    except importlib.metadata.PackageNotFoundError:
        missing = True
    return pytest.mark.skipif(missing, reason=f"{distribution} is not installed: pip install -e "
                                              "'.[clients]'")  # fmt: skip


@pytest.fixture(scope="module")
def reference_s(server: Server) -> float:
    """The text's duration from /synthesize (the same voice and noise, as a whole WAV)."""
    r = server.synth(TEXT, stream=False)
    assert r.status_code == 200, r.text
    pcm, rate = decode(r.content, "wav")
    return len(pcm) / rate


def check_audio(pcm: npt.NDArray[np.int16], rate: int, reference_s: float) -> None:
    assert rms(pcm) > 300, "silence"
    assert abs(len(pcm) / rate - reference_s) <= SLACK * reference_s, (len(pcm) / rate,
                                                                       reference_s)  # fmt: skip


@needs("livekit-plugins-openai")
@pytest.mark.parametrize(
    ("model", "response_format", "stream_format"),
    [
        ("gpt-4o-mini-tts", None, "sse"),  # the plugin's defaults: SSE events of MP3
        ("gpt-4o-mini-tts", "pcm", "sse"),
        ("tts-1", "wav", "audio"),  # OpenAI's older models: the plugin asks for the audio stream
    ],
)  # fmt: skip
def test_livekit_openai_tts(
    server: Server, reference_s: float, model: str, response_format: str | None,
    stream_format: str,
) -> None:  # fmt: skip
    from livekit.plugins import openai as livekit_openai  # noqa: PLC0415

    async def synthesize() -> tuple[list[bytes], set[int]]:
        options = {} if response_format is None else {"response_format": response_format}
        tts = livekit_openai.TTS(base_url=f"{server.url}/v1", api_key="unused", model=model,
                                 voice="alloy", **options)  # fmt: skip
        try:
            pieces, rates = [], set()
            async with tts.synthesize(TEXT) as stream:
                async for audio in stream:
                    assert audio.frame.num_channels == 1
                    rates.add(audio.frame.sample_rate)
                    pieces.append(bytes(audio.frame.data.cast("B")))
            return pieces, rates
        finally:
            await tts.aclose()

    pieces, rates = asyncio.run(synthesize())
    assert rates == {24000}
    check_audio(np.frombuffer(b"".join(pieces), "<i2"), 24000, reference_s)
    line = server.completions()[-1]
    assert (line["status"], line["stream_format"]) == ("ok", stream_format), line
    assert line["format"] == (response_format or "mp3")


@needs("pipecat-ai")
def test_pipecat_openai_tts_service(server: Server, reference_s: float) -> None:
    from pipecat.frames.frames import TTSAudioRawFrame, TTSSpeakFrame  # noqa: PLC0415
    from pipecat.pipeline.worker import PipelineParams  # noqa: PLC0415
    from pipecat.services.openai.tts import OpenAITTSService  # noqa: PLC0415
    from pipecat.tests.utils import run_test  # noqa: PLC0415

    tts = OpenAITTSService(base_url=f"{server.url}/v1", api_key="unused")
    params = PipelineParams(audio_out_sample_rate=24000)
    down, _ = asyncio.run(run_test(tts, frames_to_send=[TTSSpeakFrame(TEXT)],
                                   pipeline_params=params))  # fmt: skip
    audio = [f for f in down if isinstance(f, TTSAudioRawFrame)]
    assert audio and {f.sample_rate for f in audio} == {24000}
    check_audio(np.frombuffer(b"".join(f.audio for f in audio), "<i2"), 24000, reference_s)
    line = server.completions()[-1]
    assert (line["status"], line["format"], line["stream_format"]) == ("ok", "pcm", "audio")


@needs("pipecat-ai")
@pytest.mark.parametrize("rate", [22050, 16000])
def test_pipecat_piper_http_tts_service(server: Server, reference_s: float, rate: int) -> None:
    """Piper's HTTP client POSTs ``{"text", "voice"}`` to the URL it is given and cuts the first
    44 bytes of the answer as the WAV header, reading the sample rate from it. At the voice's own
    rate nothing is resampled, so the client must play exactly the samples the worker sent: a
    header of another length would add (or eat) samples."""
    import aiohttp  # noqa: PLC0415
    from pipecat.frames.frames import TTSAudioRawFrame, TTSSpeakFrame  # noqa: PLC0415
    from pipecat.pipeline.worker import PipelineParams  # noqa: PLC0415
    from pipecat.services.piper.tts import PiperHttpTTSService  # noqa: PLC0415
    from pipecat.tests.utils import run_test  # noqa: PLC0415

    async def synthesize() -> list[TTSAudioRawFrame]:
        async with aiohttp.ClientSession() as session:
            tts = PiperHttpTTSService(base_url=f"{server.url}/synthesize", aiohttp_session=session,
                                      settings=PiperHttpTTSService.Settings(
                                          voice="en_US-joe-medium"))  # fmt: skip
            params = PipelineParams(audio_out_sample_rate=rate)
            down, _ = await run_test(tts, frames_to_send=[TTSSpeakFrame(TEXT)],
                                     pipeline_params=params)  # fmt: skip
        return [f for f in down if isinstance(f, TTSAudioRawFrame)]

    audio = asyncio.run(synthesize())
    assert audio and {f.sample_rate for f in audio} == {rate}
    pcm = np.frombuffer(b"".join(f.audio for f in audio), "<i2")
    check_audio(pcm, rate, reference_s)
    line = server.completions()[-1]
    assert (line["status"], line["format"]) == ("ok", "wav"), line
    if rate == 22050:
        def worker_done() -> list[dict[str, object]]:
            return [e for e in server.events()
                    if e["event"] == "stream_done" and e.get("uid") == line["uid"]]  # fmt: skip

        done = wait_until(server, worker_done, bool, "the worker's stream_done line")
        assert len(pcm) == done[0]["audio_samples"]


def test_the_extra_is_declared_for_ci() -> None:
    """CI installs the frameworks (so these tests run there, not skip): the extra exists and
    ``.ci/run`` installs it."""
    root = Path(__file__).resolve().parents[2]
    pyproject = (root / "pyproject.toml").read_text()
    assert "clients = [" in pyproject
    assert "clients]" in (root / ".ci" / "run").read_text()
