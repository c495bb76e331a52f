"""The Wyoming protocol (Home Assistant), driven by the ``wyoming`` package's own client over TCP
on loopback against a real ``ttsvc serve --wyoming-port``: describe, synthesize, the text stream
Home Assistant sends (with its extra full-text ``synthesize``), error events, and one pool,
admission and set of metrics shared with HTTP."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
    SynthesizeVoice,
)

from tests.gateway.serving import Server, wait_until
from ttsvc.config import DEFAULT_VOICE
from ttsvc.repository.layout import EngineVersion

COPY = "en_US-copy-medium"
"""A second served voice: the default voice's engine files under another name."""
READ_TIMEOUT_S = 120.0
"""Bound on every wait for an event (the machine is shared; a hang fails instead of blocking)."""
REPLY = "The kitchen light is off. The bedroom lights are on now! Anything else?"
REPLY_SENTENCES = ["The kitchen light is off.", "The bedroom lights are on now!",
                   "Anything else?"]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def root(default_version: EngineVersion, tmp_path_factory: pytest.TempPathFactory) -> Path:
    engines = tmp_path_factory.mktemp("wyoming") / "engines"
    shutil.copytree(default_version.path, engines / DEFAULT_VOICE / "1")
    shutil.copytree(default_version.path, engines / COPY / "1")
    return engines


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[Server]:
    """One worker with one stream slot: a stream of either protocol holds the only slot."""
    srv = Server(root, "--workers", "1", "--max-streams-per-worker", "1",
                 "--wyoming-port", str(_free_port()))  # fmt: skip
    srv.wait_ready(1)
    wait_until(srv, lambda: voices(srv), lambda v: v == {DEFAULT_VOICE, COPY}, "both voices")
    yield srv
    srv.stop()


@pytest.fixture(autouse=True)
def idle(server: Server) -> None:
    """Each test starts with the slot free (a stream a test left ends asynchronously)."""
    server.wait_idle()


def voices(server: Server) -> set[str]:
    """The voices ``GET /voices`` says are serving."""
    listed = server.client.get("/voices").json()["voices"]
    return {v["name"] for v in listed if v["state"] == "serving"}


def wyoming_port(server: Server) -> int:
    args = server.proc.args
    assert isinstance(args, list)
    return int(args[args.index("--wyoming-port") + 1])


def client(server: Server) -> AsyncTcpClient:
    return AsyncTcpClient("127.0.0.1", wyoming_port(server), connect_timeout=10,
                          read_timeout=READ_TIMEOUT_S)  # fmt: skip


async def read_until(tcp: AsyncTcpClient, *types: str) -> list[Event]:
    """Events until one of ``types`` (included) or the end of the connection."""
    events = []
    while (event := await tcp.read_event()) is not None:
        events.append(event)
        if event.type in types:
            break
    return events


def converse(server: Server, *events: Event, until: tuple[str, ...]) -> list[Event]:
    async def run() -> list[Event]:
        async with client(server) as tcp:
            for event in events:
                await tcp.write_event(event)
            return await read_until(tcp, *until)

    return asyncio.run(run())


def audio_of(events: list[Event]) -> tuple[AudioStart, np.ndarray]:  # type: ignore[type-arg]
    """The audio-start and the samples of the audio-chunks, each chunk in its format."""
    (start,) = [AudioStart.from_event(e) for e in events if AudioStart.is_type(e.type)]
    chunks = [AudioChunk.from_event(e) for e in events if AudioChunk.is_type(e.type)]
    assert chunks
    assert {(c.rate, c.width, c.channels) for c in chunks} == {
        (start.rate, start.width, start.channels)
    }
    return start, np.frombuffer(b"".join(c.audio for c in chunks), dtype="<i2")


def request_lines(server: Server) -> list[dict[str, object]]:
    return [json.loads(x) for x in server.log_lines() if '"event": "request"' in x]


def test_describe_lists_every_served_voice_and_streaming(server: Server) -> None:
    (event,) = converse(server, Describe().event(), until=("info",))
    info = Info.from_event(event)
    (program,) = info.tts
    assert program.installed and program.supports_synthesize_streaming
    assert [v.name for v in program.voices] == [DEFAULT_VOICE, COPY]  # the default first
    listed = {v["name"]: v for v in server.client.get("/voices").json()["voices"]}
    for voice in program.voices:
        assert voice.installed
        assert voice.languages == [listed[voice.name]["language"]["code"]] == ["en_US"]
        assert voice.speakers is None  # single-speaker voices


def test_synthesize_streams_audio_in_the_voices_format(server: Server) -> None:
    events = converse(server, Synthesize(text=REPLY).event(), until=(AudioStop().event().type,))
    assert AudioStart.is_type(events[0].type) and AudioStop.is_type(events[-1].type)
    start, samples = audio_of(events)
    assert (start.rate, start.width, start.channels) == (22050, 2, 1)
    assert len(samples) / start.rate > 2.0  # three sentences of speech
    assert np.sqrt(np.mean(samples.astype(np.float64) ** 2)) > 300  # speech, not silence
    # the same request through HTTP's path: one completion line, counted as Wyoming's
    assert request_lines(server)[-1]["text_len"] == len(REPLY)


def test_a_voice_by_name_and_a_voice_by_language(server: Server) -> None:
    for voice in (SynthesizeVoice(name=COPY), SynthesizeVoice(language="en_US")):
        events = converse(server, Synthesize(text="Hi.", voice=voice).event(),
                          until=("audio-stop", "error"))  # fmt: skip
        assert AudioStop.is_type(events[-1].type), events[-1]
        audio_of(events)


def test_text_stream_speaks_each_sentence_once_as_soon_as_it_is_complete(
    server: Server,
) -> None:
    """Home Assistant's stream: chunks cut mid-word and mid-sentence, then the whole text again
    as a ``synthesize`` (for servers that do not stream), then ``synthesize-stop``. The first
    sentence is spoken before the rest of the text is even sent, and nothing twice."""
    before = len(request_lines(server))
    pieces = ["The kitch", "en light is o", "ff. The bed", "room lights are on now! Any",
              "thing el", "se?"]  # fmt: skip

    async def run() -> list[Event]:
        async with client(server) as tcp:
            await tcp.write_event(SynthesizeStart(voice=SynthesizeVoice(DEFAULT_VOICE)).event())
            for piece in pieces[:3]:
                await tcp.write_event(SynthesizeChunk(text=piece).event())
            # the first sentence is complete: its audio comes with no more text sent
            events = await read_until(tcp, "audio-chunk")
            assert AudioChunk.is_type(events[-1].type)
            for piece in pieces[3:]:
                await tcp.write_event(SynthesizeChunk(text=piece).event())
            await tcp.write_event(Synthesize(text=REPLY).event())  # Home Assistant's copy
            await tcp.write_event(SynthesizeStop().event())
            return events + await read_until(tcp, SynthesizeStopped().event().type)

    events = asyncio.run(run())
    kinds = [e.type for e in events]
    assert kinds[0] == "audio-start" and kinds[-2:] == ["audio-stop", "synthesize-stopped"]
    assert kinds.count("audio-start") == kinds.count("audio-stop") == 1
    assert "error" not in kinds
    start, samples = audio_of(events)
    assert (start.rate, start.width, start.channels) == (22050, 2, 1)
    # each sentence one request through the shared path, once: the copy was not spoken
    spoken = request_lines(server)[before:]
    assert [line["text_len"] for line in spoken] == [len(s) for s in REPLY_SENTENCES]
    assert {line["status"] for line in spoken} == {"ok"}
    whole = server.synth(REPLY, format="pcm")
    assert whole.status_code == 200
    assert 0.7 < len(samples) / (len(whole.content) / 2) < 1.4  # the reply once, not twice


EMOJI = "\U0001f642"
SILENCE_SAMPLES = round(0.05 * 22050)
"""The short silence a text with nothing to speak gets, at the voice's rate."""


def test_a_synthesize_of_an_emoji_is_a_short_silence_in_audio_events(server: Server) -> None:
    """Before: an ``error`` event and the end of the connection (Home Assistant waits on)."""
    before = len(request_lines(server))
    events = converse(server, Synthesize(text=EMOJI).event(), until=("audio-stop", "error"))
    kinds = [e.type for e in events]
    assert kinds[0] == "audio-start" and set(kinds[1:-1]) == {"audio-chunk"}
    assert kinds[-1] == "audio-stop"
    start, samples = audio_of(events)
    assert (start.rate, start.width, start.channels) == (22050, 2, 1)
    assert len(samples) == SILENCE_SAMPLES and not samples.any()
    assert all(e.data["empty_text"] is True for e in events[1:-1])  # nothing was spoken
    (line,) = request_lines(server)[before:]
    assert (line["status"], line["code"], line["worker"]) == ("empty_text", 200, None)


def test_a_text_stream_of_an_emoji_is_a_short_silence_in_audio_events(server: Server) -> None:
    """Before: the stream's sentence was skipped: an audio-start with no audio at all."""
    events = converse(server, SynthesizeStart().event(), SynthesizeChunk(text=EMOJI).event(),
                      SynthesizeStop().event(), until=("synthesize-stopped", "error"))
    kinds = [e.type for e in events]
    assert kinds[0] == "audio-start" and set(kinds[1:-2]) == {"audio-chunk"}
    assert kinds[-2:] == ["audio-stop", "synthesize-stopped"]
    _, samples = audio_of(events)
    assert len(samples) == SILENCE_SAMPLES and not samples.any()


def test_an_emoji_between_sentences_of_a_stream_is_spoken_as_a_short_silence(
    server: Server,
) -> None:
    before = len(request_lines(server))
    events = converse(server, SynthesizeStart().event(),
                      SynthesizeChunk(text=f"Hello there. {EMOJI}! See you soon.").event(),
                      SynthesizeStop().event(), until=("synthesize-stopped", "error"))  # fmt: skip
    kinds = [e.type for e in events]
    assert "error" not in kinds and kinds[-2:] == ["audio-stop", "synthesize-stopped"]
    marked = [AudioChunk.from_event(e).audio for e in events
              if e.type == "audio-chunk" and e.data.get("empty_text")]  # fmt: skip
    # its chunks (the pause before it, then its silence) are all zeros
    assert marked and not any(b"".join(marked).strip(b"\0"))
    assert [line["status"] for line in request_lines(server)[before:]] == ["ok", "empty_text",
                                                                           "ok"]  # fmt: skip


def test_empty_text_error_asks_for_the_old_answers(server: Server) -> None:
    """``"empty_text": "error"`` in the event: an ``error`` for a ``synthesize``, and a stream's
    sentence with nothing to speak skipped; any other value is refused, naming it."""
    asked = Event("synthesize", {"text": EMOJI, "empty_text": "error"})
    events = converse(server, asked, until=())
    assert [Error.from_event(e).code for e in events] == ["empty_text"]
    start = Event("synthesize-start", {"empty_text": "error"})
    events = converse(server, start, SynthesizeChunk(text=EMOJI).event(),
                      SynthesizeStop().event(), until=("synthesize-stopped", "error"))
    assert [e.type for e in events] == ["audio-start", "audio-stop", "synthesize-stopped"]
    wrong = Event("synthesize", {"text": EMOJI, "empty_text": "maybe"})
    (error,) = converse(server, wrong, until=())
    assert Error.from_event(error).code == "invalid_parameter"
    assert "empty_text" in Error.from_event(error).text


def test_an_unknown_voice_is_an_error_event(server: Server) -> None:
    for opening in (Synthesize(text="Hello.", voice=SynthesizeVoice(name="nobody")).event(),
                    SynthesizeStart(voice=SynthesizeVoice(name="nobody")).event()):  # fmt: skip
        events = converse(server, opening, until=())
        (error,) = events  # an error, then the server ends the connection
        assert Error.is_type(error.type)
        assert Error.from_event(error).code == "unknown_voice"
        assert DEFAULT_VOICE in Error.from_event(error).text  # says which voices there are
    events = converse(server, Synthesize(text="Hello.", voice=SynthesizeVoice(
        name=DEFAULT_VOICE, speaker="nobody")).event(), until=())  # fmt: skip
    assert [Error.from_event(e).code for e in events] == ["invalid_parameter"]


@pytest.mark.parametrize(
    "event",
    [
        Event("synthesize", {}),  # no text
        Event("synthesize", {"text": ["not", "a", "string"]}),
        Event("synthesize", {"text": "Hi.", "voice": {"name": {"nested": 1}}}),
        Event("synthesize-chunk", {"text": 42}),
    ],
)
def test_a_malformed_event_is_an_error_event(server: Server, event: Event) -> None:
    opening = [SynthesizeStart().event()] if event.type == "synthesize-chunk" else []
    events = converse(server, *opening, event, until=())
    assert [Error.from_event(e).code for e in events] == ["invalid_parameter"]
    audio_of(converse(server, Synthesize(text="Still here.").event(), until=("audio-stop",)))


def test_text_the_voice_cannot_speak_is_the_same_error_as_over_http(server: Server) -> None:
    text = "你好，世界。"
    http = server.synth(text)
    events = converse(server, Synthesize(text=text).event(), until=())
    assert [Error.from_event(e).code for e in events] == [http.json()["type"]]
    assert http.json()["type"] == "unsupported_script"
    long = "word " * (4096 // 5 + 1)
    events = converse(server, Synthesize(text=long).event(), until=())
    assert [Error.from_event(e).code for e in events] == ["text_too_long"]
    # the worker is fine: the next request speaks
    audio_of(converse(server, Synthesize(text="Still here.").event(), until=("audio-stop",)))


def test_http_and_wyoming_share_the_pool_admission_and_metrics(server: Server) -> None:
    """One stream slot in all: a Wyoming stream holding it makes HTTP wait its turn (429), an
    HTTP stream holding it refuses Wyoming the same way, and the metrics count both."""
    long = "This sentence is here to keep the stream going for a while. " * 12
    before = metrics(server)

    async def wyoming_holds_the_slot() -> list[Event]:
        async with client(server) as tcp:
            await tcp.write_event(Synthesize(text=long).event())
            first = await read_until(tcp, "audio-chunk")  # dispatched, streaming, not read on
            busy = await asyncio.to_thread(server.synth, "Me too.")
            assert busy.status_code == 429, busy.text
            assert busy.json()["type"] == "overloaded"
            return first + await read_until(tcp, "audio-stop")

    audio_of(asyncio.run(wyoming_holds_the_slot()))
    server.wait_idle()
    with server.client.stream("POST", "/synthesize", json={"text": long}) as held:
        assert held.status_code == 200
        body = held.iter_bytes()  # kept: a generator collected early closes the connection
        next(body)  # streaming: the slot is taken
        events = converse(server, Synthesize(text="Me too.").event(), until=())
        assert [Error.from_event(e).code for e in events] == ["overloaded"]
    after = metrics(server)
    # dispatched to the worker: one stream each way; refused: one each way, recorded alike
    assert after[WYOMING_REQUESTS] - before.get(WYOMING_REQUESTS, 0) == 1
    assert after[HTTP_REQUESTS] - before.get(HTTP_REQUESTS, 0) == 1
    assert after[OVERLOADED] - before.get(OVERLOADED, 0) == 2


WYOMING_REQUESTS = 'ttsvc_format_requests_total{api="wyoming",format="pcm"}'
HTTP_REQUESTS = 'ttsvc_format_requests_total{api="synthesize",format="wav"}'
OVERLOADED = 'ttsvc_rejections_total{reason="overloaded"}'


def metrics(server: Server) -> dict[str, float]:
    """The service's metric series (name and labels) and their values."""
    text = httpx.get(server.metrics_url, timeout=10).text
    lines = [line.rpartition(" ") for line in text.splitlines() if not line.startswith("#")]
    return {series: float(value) for series, _, value in lines if series}


def test_a_client_that_leaves_has_its_request_cancelled(server: Server) -> None:
    long = "This sentence is here to keep the stream going for a while. " * 12

    async def leave() -> None:
        async with client(server) as tcp:
            await tcp.write_event(Synthesize(text=long).event())
            await read_until(tcp, "audio-chunk")

    before = len(request_lines(server))
    asyncio.run(leave())
    server.wait_idle()  # the slot is given back: the stream did not run on for nobody
    (line,) = request_lines(server)[before:]
    assert line["status"] == "cancelled"


def test_wyoming_ssml_reads_documents_one_shot_and_streamed(root: Path) -> None:
    """``--wyoming-ssml``, for Home Assistant: a ``synthesize`` whose text starts with
    ``<speak>`` is SSML (a break is that much silence), and so is a text stream that is one
    document, held whole and spoken once at its end, whatever pieces it came in. Plain text and
    text streams that are no document are spoken as before (covered above without the flag)."""
    srv = Server(root, "--workers", "1", "--wyoming-port", str(_free_port()), "--wyoming-ssml")
    try:
        srv.wait_ready(1)
        plain = converse(srv, Synthesize(text="Hello there. Goodbye now.").event(),
                         until=("audio-stop", "error"))  # fmt: skip
        document = '<speak>Hello there. <break time="2s"/> Goodbye now.</speak>'
        once = converse(srv, Synthesize(text=document).event(), until=("audio-stop", "error"))
        start, plain_pcm = audio_of(plain)
        _, once_pcm = audio_of(once)
        added = (len(once_pcm) - len(plain_pcm)) / start.rate
        assert 1.6 < added < 2.6, added  # the break, give or take the voice's own variation
        before = len(request_lines(srv))
        pieces = ["<speak>Hello the", 're. <break time="2', 's"/> Goodbye now.</sp', "eak>"]
        streamed = converse(srv, SynthesizeStart().event(),
                            *(SynthesizeChunk(text=p).event() for p in pieces),
                            Synthesize(text=document).event(), SynthesizeStop().event(),
                            until=("synthesize-stopped", "error"))  # fmt: skip
        kinds = [e.type for e in streamed]
        assert "error" not in kinds and kinds[-1] == "synthesize-stopped", kinds
        _, streamed_pcm = audio_of(streamed)
        assert abs(len(streamed_pcm) - len(once_pcm)) / start.rate < 0.5
        (line,) = request_lines(srv)[before:]  # the document whole: one request
        assert line["status"] == "ok"
    finally:
        srv.stop()


def test_wyoming_ssml_streams_that_are_no_document_are_spoken_whole_and_at_once(
    root: Path,
) -> None:
    """With ``--wyoming-ssml``: a stream that begins like a document but is none
    (``<speakers ...``) is spoken as plain text at its end, every sentence of it (the first was
    lost); one whose start cannot be a document (``<3``) is spoken sentence by sentence as it
    comes, not held to its end; and held text is bounded by ``max_text_chars`` as one text is."""
    srv = Server(root, "--workers", "1", "--wyoming-port", str(_free_port()), "--wyoming-ssml",
                 env={"TTSVC_MAX_TEXT_CHARS": "200"})  # fmt: skip
    try:
        srv.wait_ready(1)
        before = len(request_lines(srv))
        pieces = ["<speakers are ", "loud. Turn them", " down."]
        chunks = [SynthesizeChunk(text=p).event() for p in pieces]
        events = converse(srv, SynthesizeStart().event(), *chunks, SynthesizeStop().event(),
                          until=("synthesize-stopped", "error"))  # fmt: skip
        assert [e.type for e in events][-1] == "synthesize-stopped"
        spoken = request_lines(srv)[before:]
        assert [line["text_len"] for line in spoken] == [len("<speakers are loud."),
                                                         len("Turn them down.")]  # fmt: skip

        async def stream() -> list[Event]:
            async with client(srv) as tcp:
                await tcp.write_event(SynthesizeStart().event())
                await tcp.write_event(SynthesizeChunk(text="<3 Thanks! See").event())
                # the first sentence is complete and no document can start "<3": its audio
                # comes before the rest of the text is sent
                events = await read_until(tcp, "audio-chunk", "error")
                assert AudioChunk.is_type(events[-1].type), events[-1]
                await tcp.write_event(SynthesizeChunk(text=" you soon.").event())
                await tcp.write_event(SynthesizeStop().event())
                return events + await read_until(tcp, "synthesize-stopped", "error")

        before = len(request_lines(srv))
        events = asyncio.run(stream())
        assert [e.type for e in events][-1] == "synthesize-stopped"
        spoken = request_lines(srv)[before:]
        assert [line["text_len"] for line in spoken] == [len("<3 Thanks!"), len("See you soon.")]

        # the last chunk written is the one that crosses the bound: the server answers it with
        # the error and ends the connection, and a chunk written after that would meet a closed
        # socket (a broken pipe, by chance)
        long = [SynthesizeChunk(text="<speak>" + "word " * 30).event(),
                SynthesizeChunk(text="word " * 30).event()]  # fmt: skip
        events = converse(srv, SynthesizeStart().event(), *long, until=("error",))
        error = Error.from_event(events[-1])
        assert error.code == "text_too_long", error
    finally:
        srv.stop()
