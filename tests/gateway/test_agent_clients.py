"""Voice-agent frameworks' own TTS classes against a real server: LiveKit Agents'
``livekit.plugins.openai.TTS(base_url=...)`` and Pipecat's ``OpenAITTSService`` and
``PiperHttpTTSService``, installed from PyPI (the ``clients`` extra, which CI installs), each
driven as its framework drives it and checked for real audio: samples, loudness, duration.

Every class (the ElevenLabs ones of LiveKit and Pipecat too) is also given an agent's reply
whose middle sentence is only an emoji, arriving as its own request as the framework cuts it:
each must end the turn with the other sentences' audio and no error. The server answers such a
sentence with a short silence; before, LiveKit's ``openai.TTS`` retried it into "no audio frames
were pushed" and Pipecat waited out its stop timeout. That no class went through its retry path
is read from the server: exactly one request per sentence. Pipecat's ElevenLabs WebSocket class
must also speak a reply's first sentence before the LLM has written the second.

Skipped, saying so, where the extra is not installed.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import re
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from tests.audio.decoding import decode, rms
from tests.gateway.serving import Server, wait_until

TEXT = "Hello from a voice agent. The framework plays what ttsvc streams back."
REPLY = ("Hello there.", "\U0001f642!", "See you soon.")
"""An agent's reply cut into its sentences as the frameworks and ttsvc cut it (LiveKit's
sentence tokenizer would join the three: its adapter's requests are made one by one here)."""
VOICE = "en_US-joe-medium"
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


def llm_tokens(text: str) -> list[str]:
    """``text`` as an LLM streams it: word and the space after it."""
    return re.findall(r"\S+\s*", text)


def check_emoji_turn(server: Server, before: int) -> dict[str, object]:
    """The reply's requests since ``before`` completion lines: one per sentence (none retried),
    all answered 200, the emoji's recorded ``empty_text``; returns the emoji's line."""
    lines = server.completions()[before:]
    assert sorted(str(line["status"]) for line in lines) == ["empty_text", "ok", "ok"], lines
    assert {line["code"] for line in lines} == {200}
    (empty,) = [line for line in lines if line["status"] == "empty_text"]
    return empty


def check_reply_audio(pcm: npt.NDArray[np.int16], rate: int, sentences_s: float) -> None:
    """The turn's audio is the two sentences' (loud, about as long as they are)."""
    assert rms(pcm) > 300, "silence"
    assert abs(len(pcm) / rate - sentences_s) <= SLACK * sentences_s + 0.3, (len(pcm) / rate,
                                                                             sentences_s)


@pytest.fixture(scope="module")
def sentences_s(server: Server) -> float:
    """The spoken sentences' duration from /synthesize, each on its own (the pause the
    frameworks may put between them is in the slack)."""
    total = 0.0
    for text in (REPLY[0], REPLY[2]):
        r = server.synth(text, stream=False)
        assert r.status_code == 200, r.text
        pcm, rate = decode(r.content, "wav")
        total += len(pcm) / rate
    return total


@needs("livekit-plugins-openai")
def test_livekit_openai_tts_speaks_a_reply_with_an_emoji_sentence(
    server: Server, sentences_s: float
) -> None:
    """The plugin's defaults (SSE of MP3), a ``synthesize`` per sentence as LiveKit's stream
    adapter makes them: the emoji's stream gets its short silence, not an error after retries."""
    from livekit.plugins import openai as livekit_openai  # noqa: PLC0415

    async def synthesize() -> list[bytes]:
        tts = livekit_openai.TTS(base_url=f"{server.url}/v1", api_key="unused")
        try:
            out = []
            for sentence in REPLY:
                pcm = bytearray()
                async with tts.synthesize(sentence) as stream:
                    async for audio in stream:
                        assert audio.frame.sample_rate == 24000
                        pcm += bytes(audio.frame.data.cast("B"))
                out.append(bytes(pcm))
            return out
        finally:
            await tts.aclose()

    before = len(server.completions())
    first, emoji, last = asyncio.run(synthesize())
    assert 0 < len(emoji) / 2 / 24000 <= 0.2 and rms(np.frombuffer(emoji, "<i2")) < 30
    check_reply_audio(np.frombuffer(first + last, "<i2"), 24000, sentences_s)
    empty = check_emoji_turn(server, before)
    assert (empty["format"], empty["stream_format"]) == ("mp3", "sse")


@needs("livekit-plugins-elevenlabs")
def test_livekit_elevenlabs_tts_speaks_a_reply_with_an_emoji_sentence(
    server: Server, sentences_s: float
) -> None:
    """The plugin as an agent drives it: one stream, the reply token by token, flush, end."""
    import aiohttp  # noqa: PLC0415
    from livekit.plugins import elevenlabs  # noqa: PLC0415

    async def synthesize() -> bytes:
        async with aiohttp.ClientSession() as http:
            tts = elevenlabs.TTS(base_url=f"{server.url}/v1", api_key="unused", voice_id=VOICE,
                                 encoding="pcm_24000", http_session=http)  # fmt: skip
            try:
                stream = tts.stream()
                for token in llm_tokens(" ".join(REPLY)):
                    stream.push_text(token)
                stream.flush()
                stream.end_input()
                pcm = bytearray()
                async for event in stream:
                    assert event.frame.sample_rate == 24000
                    pcm += bytes(event.frame.data.cast("B"))
                await stream.aclose()
                return bytes(pcm)
            finally:
                await tts.aclose()

    before = len(server.completions())
    check_reply_audio(np.frombuffer(asyncio.run(synthesize()), "<i2"), 24000, sentences_s)
    assert check_emoji_turn(server, before)["format"] == "pcm"


async def run_pipecat(service: object, rate: int) -> tuple[list[object], list[object]]:
    """Pipecat's test pipeline around ``service``, given the reply as an LLM's tokens (the
    service cuts it into sentences and makes a request of each); its frames down and up."""
    from pipecat.frames.frames import (  # noqa: PLC0415
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
    )
    from pipecat.pipeline.worker import PipelineParams  # noqa: PLC0415
    from pipecat.tests.utils import run_test  # noqa: PLC0415

    frames = [LLMFullResponseStartFrame(), *(LLMTextFrame(t) for t in llm_tokens(" ".join(REPLY))),
              LLMFullResponseEndFrame()]  # fmt: skip

    down, up = await run_test(service, frames_to_send=frames,  # type: ignore[arg-type]
                              pipeline_params=PipelineParams(audio_out_sample_rate=rate))
    return list(down), list(up)


def check_pipecat_turn(frames: tuple[list[object], list[object]], rate: int,
                       sentences_s: float) -> None:  # fmt: skip
    """No error frame either way; the sentences' audio at ``rate``; the turn ended (its
    ``TTSStoppedFrame``)."""
    from pipecat.frames.frames import ErrorFrame, TTSAudioRawFrame, TTSStoppedFrame  # noqa: PLC0415

    down, up = frames
    assert not [f for f in down + up if isinstance(f, ErrorFrame)]
    audio = [f for f in down if isinstance(f, TTSAudioRawFrame)]
    assert audio and {f.sample_rate for f in audio} == {rate}
    check_reply_audio(np.frombuffer(b"".join(f.audio for f in audio), "<i2"), rate, sentences_s)
    assert [f for f in down if isinstance(f, TTSStoppedFrame)]


@needs("pipecat-ai")
def test_pipecat_piper_http_tts_service_speaks_a_reply_with_an_emoji_sentence(
    server: Server, sentences_s: float
) -> None:
    """Piper's client posts to ``/synthesize``, which gave its emoji a 422 (an error frame)."""
    import aiohttp  # noqa: PLC0415
    from pipecat.services.piper.tts import PiperHttpTTSService  # noqa: PLC0415

    async def make_and_run() -> tuple[list[object], list[object]]:
        async with aiohttp.ClientSession() as session:
            tts = PiperHttpTTSService(base_url=f"{server.url}/synthesize", aiohttp_session=session,
                                      settings=PiperHttpTTSService.Settings(voice=VOICE))
            return await run_pipecat(tts, 22050)

    before = len(server.completions())
    check_pipecat_turn(asyncio.run(make_and_run()), 22050, sentences_s)
    assert check_emoji_turn(server, before)["format"] == "wav"


@needs("pipecat-ai")
def test_pipecat_openai_tts_service_speaks_a_reply_with_an_emoji_sentence(
    server: Server, sentences_s: float
) -> None:
    from pipecat.services.openai.tts import OpenAITTSService  # noqa: PLC0415

    before = len(server.completions())
    tts = OpenAITTSService(base_url=f"{server.url}/v1", api_key="unused")
    frames = asyncio.run(run_pipecat(tts, 24000))
    check_pipecat_turn(frames, 24000, sentences_s)
    assert check_emoji_turn(server, before)["format"] == "pcm"


@needs("pipecat-ai")
def test_pipecat_elevenlabs_tts_service_speaks_a_reply_with_an_emoji_sentence(
    server: Server, sentences_s: float
) -> None:
    """The WebSocket class: whole sentences with ``auto_mode=true``."""
    from pipecat.services.elevenlabs.tts import ElevenLabsTTSService  # noqa: PLC0415

    before = len(server.completions())
    tts = ElevenLabsTTSService(api_key="unused", url=server.url.replace("http://", "ws://"),
                               settings=ElevenLabsTTSService.Settings(voice=VOICE))  # fmt: skip
    check_pipecat_turn(asyncio.run(run_pipecat(tts, 24000)), 24000, sentences_s)
    assert check_emoji_turn(server, before)["format"] == "pcm"


@needs("pipecat-ai")
def test_pipecat_elevenlabs_http_tts_service_speaks_a_reply_with_an_emoji_sentence(
    server: Server, sentences_s: float
) -> None:
    import aiohttp  # noqa: PLC0415
    from pipecat.services.elevenlabs.tts import ElevenLabsHttpTTSService  # noqa: PLC0415

    async def make_and_run() -> tuple[list[object], list[object]]:
        async with aiohttp.ClientSession() as session:
            tts = ElevenLabsHttpTTSService(api_key="unused", aiohttp_session=session,
                                           base_url=server.url,
                                           settings=ElevenLabsHttpTTSService.Settings(
                                               voice=VOICE))  # fmt: skip
            return await run_pipecat(tts, 24000)

    before = len(server.completions())
    check_pipecat_turn(asyncio.run(make_and_run()), 24000, sentences_s)
    assert check_emoji_turn(server, before)["format"] == "pcm"


@needs("pipecat-ai")
def test_pipecat_elevenlabs_tts_service_speaks_the_first_sentence_before_the_second_is_written(
    server: Server, sentences_s: float
) -> None:
    """The WebSocket class sends each sentence as Pipecat's aggregator cuts it (``auto_mode``,
    no flush): its audio must come while the LLM is still writing the next one. The LLM here
    writes the first sentence and the next one's first word (Pipecat's ``SimpleTextAggregator``
    releases "Hello there." only once text follows it, as ``"Hello. N"``), then waits for the
    first audio frame before it writes a word more. Before ``auto_mode`` was honoured, that
    audio never came (the server held the sentence for more text)."""
    from pipecat.frames.frames import (  # noqa: PLC0415
        EndFrame,
        Frame,
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
        TTSAudioRawFrame,
    )
    from pipecat.pipeline.pipeline import Pipeline  # noqa: PLC0415
    from pipecat.pipeline.runner import WorkerRunner  # noqa: PLC0415
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker  # noqa: PLC0415
    from pipecat.processors.frame_processor import FrameDirection  # noqa: PLC0415
    from pipecat.services.elevenlabs.tts import ElevenLabsTTSService  # noqa: PLC0415
    from pipecat.tests.utils import QueuedFrameProcessor  # noqa: PLC0415

    tokens = llm_tokens(f"{REPLY[0]} {REPLY[2]}")
    head = tokens.index("See ") + 1  # the first sentence and the next one's first word

    async def converse() -> tuple[list[Frame], list[Frame]]:
        """Frames down before the first audio (inclusive), and all of them after it."""
        tts = ElevenLabsTTSService(api_key="unused", url=server.url.replace("http://", "ws://"),
                                   settings=ElevenLabsTTSService.Settings(voice=VOICE))
        received: asyncio.Queue[Frame] = asyncio.Queue()
        sink = QueuedFrameProcessor(queue=received, queue_direction=FrameDirection.DOWNSTREAM)
        worker = PipelineWorker(Pipeline([tts, sink]), cancel_on_idle_timeout=False,
                                params=PipelineParams(audio_out_sample_rate=24000))
        started = asyncio.Event()

        @worker.event_handler("on_pipeline_started")
        async def on_started(*_: object) -> None:
            started.set()

        async def first_audio() -> list[Frame]:
            frames: list[Frame] = []
            while not (frames and isinstance(frames[-1], TTSAudioRawFrame)):
                frames.append(await received.get())
            return frames

        async def write() -> list[Frame]:
            try:
                await asyncio.wait_for(started.wait(), timeout=30)
                await worker.queue_frame(LLMFullResponseStartFrame())
                for token in tokens[:head]:
                    await worker.queue_frame(LLMTextFrame(token))
                before = await asyncio.wait_for(first_audio(), timeout=30)
            except BaseException:
                await worker.cancel(reason="no first audio")  # an EndFrame would wait for it
                raise
            for token in tokens[head:]:
                await worker.queue_frame(LLMTextFrame(token))
            await worker.queue_frame(LLMFullResponseEndFrame())
            await worker.queue_frame(EndFrame())
            return before

        runner = WorkerRunner()
        await runner.add_workers(worker)
        _, before = await asyncio.gather(runner.run(), write())
        after = []
        while not received.empty():
            after.append(received.get_nowait())
        return before, after

    before, after = asyncio.run(converse())
    audio = [f for f in before + after if isinstance(f, TTSAudioRawFrame)]
    assert {f.sample_rate for f in audio} == {24000}
    check_reply_audio(np.frombuffer(b"".join(f.audio for f in audio), "<i2"), 24000,
                      sentences_s)  # fmt: skip
