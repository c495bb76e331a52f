"""The Wyoming protocol (Home Assistant's voice pipeline) on its own TCP port.

Runs on the gateway's event loop, started and stopped in the app's lifespan, and serves every
synthesis through the very path ``POST /synthesize`` takes (``ttsvc.gateway.app._synthesize``):
the same admission, stream slots, key quotas, balancer, worker pool, metrics and completion log
line, and the same errors. A Wyoming request is handed to it as an HTTP request whose scope this
module makes, and the streaming response it returns is driven the way uvicorn drives one, its
body (raw PCM) going out as ``audio-chunk`` events. So audio starts when the worker's first
window arrives, not once a sentence is whole, and no second route to the workers exists.

Events: ``describe`` → ``info`` (every served voice, ``supports_synthesize_streaming``);
``synthesize`` → ``audio-start``, ``audio-chunk``s, ``audio-stop``; a text stream
(``synthesize-start``, ``synthesize-chunk``s, ``synthesize-stop``) speaks each sentence as soon
as it is complete (``ttsvc.text.incremental``) and ends with ``audio-stop`` and
``synthesize-stopped``. Home Assistant also sends the whole text as a ``synthesize`` inside its
streams (for servers that do not stream): a connection that streams ignores it, or every reply
would be spoken twice. A failure is an ``error`` event (``code`` is the HTTP error's ``type``),
after which the server closes the connection: Home Assistant does not read ``error`` and waits
for audio or the end of the connection.

The protocol carries no credentials: with API keys on, Wyoming requests are charged to a key
named ``wyoming`` with the default quota, like any key whose line sets none.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.requests import ClientDisconnect, Request
from starlette.types import Message, Scope
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Attribution, Describe, Info, TtsProgram, TtsVoice, TtsVoiceSpeaker
from wyoming.server import AsyncEventHandler, AsyncTcpServer
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
    SynthesizeVoice,
)

from ttsvc import __version__
from ttsvc.audio.encode import FORMATS
from ttsvc.backends.base import EngineSource
from ttsvc.errors import InvalidParameter, NothingToSay, TTSError, UnknownVoice
from ttsvc.gateway.app import (
    ExchangeStreamingResponse,
    GatewayState,
    SpeechOrder,
    WorkerReportedError,
    _error,
    _synthesize,
)
from ttsvc.gateway.auth import ApiKey
from ttsvc.observability.logs import get_logger
from ttsvc.protocol import EngineSpec
from ttsvc.text.incremental import SentenceBuffer
from ttsvc.voice import VOICE_FILE, VoiceConfig, describe, speaker_id

log = get_logger("wyoming")

SAMPLES_PER_CHUNK = 1024
"""Samples per ``audio-chunk`` event, as wyoming-piper sends them: a worker's later windows
hold seconds of audio, and satellites play small chunks more smoothly."""
SENTENCE_SILENCE_S = 0.2
"""Silence between sentences, as ``/synthesize`` puts between the sentences of one text (in a
text stream each sentence is a request of its own)."""
WYOMING_KEY = "wyoming"
"""The key name Wyoming requests are charged to when API keys are on."""
PIPER_URL = "https://github.com/OHF-Voice/piper1-gpl"
WIDTH, CHANNELS = 2, 1  # 16-bit mono PCM, what every voice speaks


class ConnectionGone(Exception):
    """The Wyoming client closed its connection while its audio was being sent."""


@dataclass(frozen=True)
class _Voice:
    """A request's voice resolved: the served voice and its speaker id."""

    name: str
    speaker: int | None


@dataclass(frozen=True)
class _Once:
    """A ``synthesize`` outside a text stream: one request, its own audio-start and -stop."""

    text: str
    voice: SynthesizeVoice | None


@dataclass(frozen=True)
class _Start:
    voice: SynthesizeVoice | None


@dataclass(frozen=True)
class _Sentence:
    text: str


@dataclass(frozen=True)
class _Stop:
    pass


_Work = _Once | _Start | _Sentence | _Stop


class WyomingServer:
    """The gateway's Wyoming listener (``--wyoming-port``); one handler per connection."""

    def __init__(self, state: GatewayState, host: str, port: int) -> None:
        self.state = state
        self.host = host
        self.port = port
        self._server = AsyncTcpServer(host, port)
        self.handlers: set[WyomingHandler] = set()
        """Connections open now."""
        self._configs: dict[tuple[str, str], dict[str, object]] = {}

    async def start(self) -> None:
        def connected(reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> WyomingHandler:  # fmt: skip
            handler = WyomingHandler(self, reader, writer)
            self.handlers.add(handler)
            return handler

        await self._server.start(connected)
        log.info("wyoming_listening", host=self.host, port=self.port,
                 authenticated=False)  # fmt: skip

    async def stop(self) -> None:
        """Stop listening and end every connection (their requests are cancelled)."""
        await self._server.stop()
        await asyncio.gather(*(h.disconnect() for h in list(self.handlers)))

    async def config(self, spec: EngineSpec) -> dict[str, object]:
        """A served engine version's Piper config (read once, off the event loop)."""
        key = spec.voice, spec.label
        if key not in self._configs:
            raw = await asyncio.to_thread(EngineSource.from_spec(spec).read, VOICE_FILE)
            self._configs[key] = json.loads(raw.decode("utf-8"))
        return self._configs[key]

    async def info(self) -> Info:
        """Every voice served now, the default first, with its language and speakers."""
        catalog, default = self.state.catalog, self.state.voice
        served = catalog.serving() if catalog is not None else {}
        voices = []
        for name in sorted(served, key=lambda n: (n != default, n)):
            spec = served[name]
            about = describe(await self.config(spec))
            language = about["language"]
            assert isinstance(language, dict)
            code = language.get("code") or language.get("espeak_voice") or "und"
            speakers = about["speakers"]
            assert isinstance(speakers, list)
            many = isinstance(about["num_speakers"], int) and about["num_speakers"] > 1
            details = (language.get("name") or code, about["quality"])
            voices.append(TtsVoice(
                name=name, attribution=Attribution(name="Piper", url=PIPER_URL), installed=True,
                description=f"{name} ({', '.join(str(x) for x in details if x)})",
                version=spec.label, languages=[str(code)],
                speakers=[TtsVoiceSpeaker(str(s)) for s in speakers] if many else None,
            ))  # fmt: skip
        program = TtsProgram(
            name="ttsvc", attribution=Attribution(name="ttsvc", url=""), installed=True,
            description="ttsvc streaming text to speech", version=__version__, voices=voices,
            supports_synthesize_streaming=True,
        )  # fmt: skip
        return Info(tts=[program])

    async def resolve(self, wanted: SynthesizeVoice | None) -> _Voice:
        """The served voice and speaker a request names (by name, else by language), checked
        as ``/synthesize`` checks them: an unknown voice or speaker is the same error."""
        name = None if wanted is None else wanted.name
        if wanted is not None and name is None and wanted.language:
            name = await self._by_language(wanted.language)
        voice = self.state.resolve_voice(name)
        spoken = None if wanted is None else wanted.speaker
        swapper = self.state.catalog.get(voice) if self.state.catalog is not None else None
        if spoken is None or swapper is None or swapper.current is None:
            return _Voice(voice, None)
        config = VoiceConfig.from_piper(await self.config(swapper.current), voice)
        try:
            return _Voice(voice, speaker_id(config, spoken))
        except ValueError as exc:
            raise InvalidParameter(str(exc), field="speaker") from exc

    async def _by_language(self, language: str) -> str:
        """The default voice if it speaks ``language`` (``en_US``, ``en-us`` or ``en``), else the
        first served voice that does."""
        catalog = self.state.catalog
        served = catalog.serving() if catalog is not None else {}

        def norm(code: str) -> str:
            return code.replace("-", "_").lower()

        wanted = norm(language)
        for name in sorted(served, key=lambda n: (n != self.state.voice, n)):
            code = describe(await self.config(served[name]))["language"]
            assert isinstance(code, dict)
            spoken = norm(str(code.get("code") or code.get("espeak_voice") or ""))
            if spoken == wanted or spoken.split("_")[0] == wanted:
                return name
        raise UnknownVoice(f"no served voice speaks {language!r}", field="voice")

    def request(self, receive: Callable[[], Awaitable[Message]]) -> Request:
        """An HTTP request as ``_synthesize`` takes it, for one Wyoming synthesis (its path is
        the one it takes, so a refusal is recorded as that route's are)."""
        scope: Scope = {
            "type": "http",
            # 2.4: the response streams without listening for a disconnect itself (the
            # connection's handler cancels the request when its client leaves)
            "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/synthesize",
            "raw_path": b"/synthesize",
            "query_string": b"",
            "headers": [],
            "server": (self.host, self.port),
            "state": {"started": time.perf_counter(), "format": "pcm"},
        }
        request = Request(scope, receive)
        keys = self.state.keys
        if keys is not None:
            request.state.key = ApiKey(WYOMING_KEY, b"", keys.default)
            request.state.key_name = WYOMING_KEY
        return request


def _text(value: object) -> str:
    """An event's ``text``, which must be a string (anything else is a malformed event)."""
    if not isinstance(value, str):
        raise TypeError("text must be a string")
    return value


def _voice(value: SynthesizeVoice | None) -> SynthesizeVoice | None:
    """An event's ``voice``, checked: the package takes its fields as they come in the JSON."""
    if value is not None and not all(isinstance(v, str | int | None) for v in vars(value).values()):
        raise TypeError("voice fields must be strings")
    return value


class WyomingHandler(AsyncEventHandler):
    """One Wyoming connection, on the gateway's event loop.

    Events are read as they come while a speaker task works through what they asked for, in
    order: the text of a stream keeps arriving while its first sentence is spoken, and a client
    that leaves is noticed (its request is cancelled in the worker) even mid-sentence.
    """

    def __init__(self, server: WyomingServer, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:  # fmt: skip
        super().__init__(reader, writer)
        self.server = server
        self.streamed = False
        """The client has used a text stream: a full-text ``synthesize`` is only its copy."""
        self.buffer: SentenceBuffer | None = None
        """The open text stream's sentences (``None``: no stream open)."""
        self.work: asyncio.Queue[_Work] = asyncio.Queue()
        self.gone = asyncio.Event()
        self.speaker = asyncio.ensure_future(self._speak())
        # the stream being answered: its voice, whether audio-start went out, audio sent so far
        self.voice: _Voice | None = None
        self.started = False
        self.sent_s = 0.0

    async def handle_event(self, event: Event) -> bool:
        if self.speaker.done():  # it failed and said so: nothing more on this connection
            return False
        try:
            await self._take(event)
        except (KeyError, TypeError, ValueError, AttributeError):
            await self._fail("invalid_parameter", f"malformed {event.type!r} event: "
                             f"{json.dumps(event.data, default=str)[:200]}")  # fmt: skip
            return False
        return True

    async def _take(self, event: Event) -> None:
        """Answer ``describe`` at once; queue what the other events ask for, in order."""
        if Describe.is_type(event.type):
            await self.write_event((await self.server.info()).event())
        elif Synthesize.is_type(event.type):
            if not self.streamed:
                synthesize = Synthesize.from_event(event)
                self.work.put_nowait(_Once(_text(synthesize.text), _voice(synthesize.voice)))
        elif SynthesizeStart.is_type(event.type):
            if self.buffer is not None:  # a new stream ends the one left open
                self._stop_stream()
            self.streamed = True
            self.buffer = SentenceBuffer(self.server.state.settings.max_sentence_chars)
            self.work.put_nowait(_Start(_voice(SynthesizeStart.from_event(event).voice)))
        elif SynthesizeChunk.is_type(event.type):
            if self.buffer is not None:
                for sentence in self.buffer.append(_text(SynthesizeChunk.from_event(event).text)):
                    self.work.put_nowait(_Sentence(sentence))
        elif SynthesizeStop.is_type(event.type) and self.buffer is not None:
            self._stop_stream()

    def _stop_stream(self) -> None:
        assert self.buffer is not None
        for sentence in self.buffer.flush():
            self.work.put_nowait(_Sentence(sentence))
        self.work.put_nowait(_Stop())
        self.buffer = None

    async def disconnect(self) -> None:
        """The client closed the connection (or the server stops): whatever it asked for that is
        still running is cancelled, in its worker too."""
        self.server.handlers.discard(self)
        self.gone.set()
        self.speaker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.speaker

    async def _speak(self) -> None:
        try:
            while True:
                await self._do(await self.work.get())
        except ConnectionGone:
            pass
        except TTSError as exc:
            await self._fail(exc.type, exc.message)
        except Exception:
            log.exception("wyoming_internal_error")
            await self._fail("internal_error", "internal error")

    async def _fail(self, code: str, text: str) -> None:
        """Tell the client why, then end the connection (see the module docstring)."""
        with contextlib.suppress(OSError, RuntimeError):
            await self.write_event(Error(text=text, code=code).event())
        await self.stop()

    async def _do(self, work: _Work) -> None:
        if isinstance(work, _Once | _Start):  # a new reply: its voice, no audio yet
            try:
                self.voice = await self.server.resolve(work.voice)
            except TTSError as exc:
                self._refused(self.server.request(self._receive), exc)
                raise
            self.started, self.sent_s = False, 0.0
        if isinstance(work, _Once):
            await self._synthesize(work.text)
            await self._end_audio()
        elif isinstance(work, _Start):
            pass
        elif isinstance(work, _Sentence):
            try:
                await self._synthesize(work.text)
            except NothingToSay:
                pass  # a piece of a reply with nothing to say ("...", an emoji) is not an error
            except WorkerReportedError as exc:
                if exc.type != NothingToSay.type:
                    raise
        else:
            await self._end_audio()
            await self._write(SynthesizeStopped().event())

    async def _receive(self) -> Message:
        """The request's ASGI receive: its body was read; next comes the client leaving."""
        await self.gone.wait()
        return {"type": "http.disconnect"}

    def _refused(self, request: Request, exc: TTSError) -> None:
        """Record a request refused before any audio, as HTTP's exception handler does (once:
        an exchange that failed recorded itself)."""
        _error(self.server.state, request, exc.to_body(), exc.status)

    async def _end_audio(self) -> None:
        if not self.started:  # nothing was said: the client still learns the format
            await self._audio_start()
        await self._write(AudioStop(timestamp=round(1000 * self.sent_s)).event())

    async def _audio_start(self) -> None:
        assert self.voice is not None
        rate = self.server.state.native_rate(self.voice.name)
        await self._write(AudioStart(rate=rate, width=WIDTH, channels=CHANNELS).event())
        self.started = True

    async def _write(self, event: Event) -> None:
        try:
            await self.write_event(event)
        except (OSError, RuntimeError) as exc:  # RuntimeError: a transport already closed
            raise ConnectionGone from exc

    async def _synthesize(self, text: str) -> None:
        """One request through the HTTP path, its PCM sent as audio-chunk events as it comes."""
        assert self.voice is not None
        state = self.server.state
        order = SpeechOrder(text, 1.0, None, None, SENTENCE_SILENCE_S, None, FORMATS["pcm"],
                            True, "wyoming", self.voice.name, self.voice.speaker)  # fmt: skip
        rate = state.native_rate(self.voice.name)
        first = True

        async def send(message: Message) -> None:
            nonlocal first
            if message["type"] != "http.response.body" or not message.get("body"):
                return
            pcm: bytes = message["body"]
            if first:
                first = False
                if not self.started:
                    await self._audio_start()
                elif self.sent_s > 0:  # the pause between this sentence and the one before
                    pcm = bytes(WIDTH * round(SENTENCE_SILENCE_S * rate)) + pcm
            step = WIDTH * SAMPLES_PER_CHUNK
            for at in range(0, len(pcm), step):
                piece = pcm[at : at + step]
                chunk = AudioChunk(rate=rate, width=WIDTH, channels=CHANNELS, audio=piece,
                                   timestamp=round(1000 * self.sent_s))  # fmt: skip
                await self._write(chunk.event())
                self.sent_s += len(piece) / WIDTH / rate

        request = self.server.request(self._receive)
        try:
            response = await _synthesize(state, order, request)
        except TTSError as exc:
            self._refused(request, exc)
            raise
        try:
            await response(request.scope, self._receive, send)
        except ClientDisconnect as exc:
            raise ConnectionGone from exc
        if isinstance(response, ExchangeStreamingResponse) and response.exchange.failure:
            raise WorkerReportedError(response.exchange.failure)
