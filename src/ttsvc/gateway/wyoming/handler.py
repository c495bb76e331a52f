"""One connection to the Wyoming server (``wyoming``): its events read as they come, and what
they ask for spoken in order through the request core.

It exists apart from the server (``wyoming``: listener, voice catalog, requests) so one
connection's life can be read on its own.

Events: ``describe`` → ``info`` (every served voice, ``supports_synthesize_streaming``);
``synthesize`` → ``audio-start``, ``audio-chunk``s, ``audio-stop``; a text stream
(``synthesize-start``, ``synthesize-chunk``s, ``synthesize-stop``) speaks each sentence as soon
as it is complete (``ttsvc.text.incremental``) and ends with ``audio-stop`` and
``synthesize-stopped``. Home Assistant also sends the whole text as a ``synthesize`` inside its
streams (for servers that do not stream): a connection that streams ignores it, or every reply
would be spoken twice. Text with nothing to speak (an emoji) is a short silence, its
``audio-chunk`` events marked ``empty_text: true``; ``"empty_text": "error"`` in the data of
``synthesize`` or ``synthesize-start`` asks for the old answer instead (an ``error`` for a
``synthesize``, nothing for a sentence of a stream). A failure is an ``error`` event (``code``
is the HTTP error's ``type``), after which the server closes the connection: Home Assistant does
not read ``error`` and waits for audio or the end of the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe
from wyoming.server import AsyncEventHandler
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
    SynthesizeVoice,
)

from ttsvc.audio.encode import FORMATS
from ttsvc.errors import NothingToSay, TextTooLong, TTSError
from ttsvc.gateway.core.caller import Caller
from ttsvc.gateway.core.exchange import WorkerReportedError, start_exchange
from ttsvc.gateway.core.keys import ApiKey
from ttsvc.gateway.core.order import EmptyText, SpeechOrder, empty_text_mode
from ttsvc.gateway.core.records import record_refusal
from ttsvc.gateway.core.state import GatewayState
from ttsvc.gateway.wyoming.events import EventLimits, EventReader, IdleConnection
from ttsvc.gateway.wyoming.voices import Voice, WyomingVoices
from ttsvc.observability.logs import get_logger
from ttsvc.text.incremental import SentenceBuffer
from ttsvc.text.ssml import is_ssml, may_be_ssml

log = get_logger("wyoming")

SAMPLES_PER_CHUNK = 1024
"""Samples per ``audio-chunk`` event, as wyoming-piper sends them: a worker's later windows
hold seconds of audio, and satellites play small chunks more smoothly."""
SENTENCE_SILENCE_S = 0.2
"""Silence between sentences, as ``/synthesize`` puts between the sentences of one text (in a
text stream each sentence is a request of its own)."""
WYOMING_KEY = "wyoming"
"""The key name Wyoming requests are charged to when API keys are on (the protocol carries no
credentials)."""
WIDTH, CHANNELS = 2, 1  # 16-bit mono PCM, what every voice speaks


class ConnectionGone(Exception):
    """The Wyoming client closed its connection while its audio was being sent."""


@dataclass(frozen=True)
class _Once:
    """A ``synthesize`` outside a text stream: one request, its own audio-start and -stop."""

    text: str
    voice: SynthesizeVoice | None
    empty_text: EmptyText


@dataclass(frozen=True)
class _Start:
    voice: SynthesizeVoice | None
    empty_text: EmptyText


@dataclass(frozen=True)
class _Sentence:
    text: str
    ssml: bool = False
    """A text stream's whole SSML document (``--wyoming-ssml``), not one of its sentences."""


@dataclass(frozen=True)
class _Stop:
    pass


_Work = _Once | _Start | _Sentence | _Stop


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

    def __init__(self, state: GatewayState, voices: WyomingVoices, limits: EventLimits,
                 reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                 closed: Callable[[str], None],
                 gone: Callable[[WyomingHandler], None]) -> None:  # fmt: skip
        """``closed``: counts a connection the server ended because of its client (the
        reason); ``gone``: tells the server this connection is over."""
        super().__init__(reader, writer)
        self.state = state
        self.voices = voices
        self.limits = limits
        self.closed = closed
        self.forget = gone
        self.streamed = False
        """The client has used a text stream: a full-text ``synthesize`` is only its copy."""
        self.buffer: SentenceBuffer | None = None
        """The open text stream's sentences (``None``: no stream open)."""
        self.ssml = state.settings.wyoming_ssml
        """Read a text that starts like an SSML document as SSML (``--wyoming-ssml``)."""
        self.held: str | None = None
        """With ``ssml``: the open stream's text, held whole while it can still be a document
        (``may_be_ssml``), which is spoken whole once the stream ends, not sentence by sentence;
        at most ``max_text_chars``."""
        self.fresh = False
        """The open stream has had no text yet."""
        self.work: asyncio.Queue[_Work] = asyncio.Queue()
        self.speaking = False
        """The speaker task is doing a piece of work now (a reply is being spoken)."""
        self.gone = asyncio.Event()
        self.events = EventReader(reader, limits, self.busy)
        self.speaker = asyncio.ensure_future(self._speak())
        # the stream being answered: its voice, whether audio-start went out, audio sent so far
        self.voice: Voice | None = None
        self.empty_text: EmptyText = "silence"
        self.started = False
        self.sent_s = 0.0

    def busy(self) -> bool:
        """Whether the client is waiting on this connection (a reply is spoken or queued): the
        idle timeout runs only while it is not."""
        return self.speaking or not self.work.empty()

    async def run(self) -> None:
        """Read events within the server's limits (``wyoming_events``) until the client ends the
        connection, goes idle, sends what is refused, or the server stops it."""
        self._is_running = True
        try:
            while self._is_running:
                try:
                    event = await self.events.next()
                except IdleConnection:
                    self.closed("idle")
                    break
                except TTSError as exc:  # too large, not JSON, sent too slowly
                    self.closed(exc.type)
                    await self._fail(exc.type, exc.message)
                    break
                if event is None or not await self.handle_event(event):
                    break
        finally:
            await self.disconnect()
            self.writer.close()

    async def handle_event(self, event: Event) -> bool:
        if self.speaker.done():  # it failed and said so: nothing more on this connection
            return False
        try:
            await self._take(event)
        except TTSError as exc:  # a field of ours refused (``empty_text``)
            await self._fail(exc.type, exc.message)
            return False
        except (KeyError, TypeError, ValueError, AttributeError):
            await self._fail("invalid_parameter", f"malformed {event.type!r} event: "
                             f"{json.dumps(event.data, default=str)[:200]}")  # fmt: skip
            return False
        return True

    async def _take(self, event: Event) -> None:
        """Answer ``describe`` at once; queue what the other events ask for, in order."""
        if Describe.is_type(event.type):
            await self.write_event((await self.voices.info()).event())
        elif Synthesize.is_type(event.type):
            if not self.streamed:
                synthesize = Synthesize.from_event(event)
                self.work.put_nowait(_Once(_text(synthesize.text), _voice(synthesize.voice),
                                           empty_text_mode(event.data.get("empty_text"))))
        elif SynthesizeStart.is_type(event.type):
            if self.buffer is not None:  # a new stream ends the one left open
                self._stop_stream()
            self.streamed = True
            self.buffer = SentenceBuffer(self.state.settings.max_sentence_chars)
            self.held, self.fresh = None, True
            self.work.put_nowait(_Start(_voice(SynthesizeStart.from_event(event).voice),
                                        empty_text_mode(event.data.get("empty_text"))))
        elif SynthesizeChunk.is_type(event.type):
            if self.buffer is not None:
                text = _text(SynthesizeChunk.from_event(event).text)
                if self.held is not None or (self.ssml and self.fresh
                                             and text.lstrip().startswith("<")):  # fmt: skip
                    self._hold((self.held or "") + text)
                else:
                    self._queue(text)
                self.fresh = self.fresh and not text.strip()
        elif SynthesizeStop.is_type(event.type) and self.buffer is not None:
            self._stop_stream()

    def _hold(self, text: str) -> None:
        """Hold the stream's text while it can still become an SSML document (within
        ``max_text_chars``, as one text is); release it as plain text once it cannot."""
        if not may_be_ssml(text):
            self.held = None
            self._queue(text)
            return
        limit = self.state.settings.max_text_chars
        if len(text) > limit:
            raise TextTooLong(f"text is over {limit} characters (max_text_chars)", field="text")
        self.held = text

    def _queue(self, text: str) -> None:
        """The stream's next text: each sentence it completes is queued to be spoken."""
        assert self.buffer is not None
        for sentence in self.buffer.append(text):
            self.work.put_nowait(_Sentence(sentence))

    def _stop_stream(self) -> None:
        assert self.buffer is not None
        held, self.held = self.held, None
        if held is not None and is_ssml(held):
            self.work.put_nowait(_Sentence(held, ssml=True))
        elif held is not None:  # it began like a document but is none: plain text after all
            self._queue(held)
        for sentence in self.buffer.flush():
            self.work.put_nowait(_Sentence(sentence))
        self.work.put_nowait(_Stop())
        self.buffer = None

    async def disconnect(self) -> None:
        """The client closed the connection (or the server stops): whatever it asked for that is
        still running is cancelled, in its worker too."""
        self.forget(self)
        self.gone.set()
        self.speaker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.speaker

    async def _speak(self) -> None:
        try:
            while True:
                work = await self.work.get()
                self.speaking = True
                await self._do(work)
                self.speaking = False
                self.events.idle.touch()  # its reply is sent: the idle time counts from now
        except ConnectionGone:
            pass
        except TTSError as exc:
            await self._fail(exc.type, exc.message)
        except Exception:
            log.exception("wyoming_internal_error")
            await self._fail(TTSError.type, "internal error")

    async def _fail(self, code: str, text: str) -> None:
        """Tell the client why, then end the connection (see the module docstring)."""
        with contextlib.suppress(OSError, RuntimeError):
            await self.write_event(Error(text=text, code=code).event())
        await self.stop()

    async def _do(self, work: _Work) -> None:
        if isinstance(work, _Once | _Start):  # a new reply: its voice, no audio yet
            caller = self._caller()
            try:
                self.voice = await self.voices.resolve(work.voice, caller)
            except TTSError as exc:
                self._refused(caller, exc)
                raise
            self.started, self.sent_s = False, 0.0
            self.empty_text = work.empty_text
        if isinstance(work, _Once):
            await self._synthesize(work.text, self.ssml and is_ssml(work.text))
            await self._end_audio()
        elif isinstance(work, _Start):
            pass
        elif isinstance(work, _Sentence):
            try:
                await self._synthesize(work.text, work.ssml)
            except NothingToSay:
                pass  # a piece of a reply with nothing to say ("...", an emoji) is not an error
            except WorkerReportedError as exc:
                if exc.type != NothingToSay.type:
                    raise
        else:
            await self._end_audio()
            await self._write(SynthesizeStopped().event())

    def _caller(self) -> Caller:
        """A Wyoming synthesis as the request core's caller (it leaves when its connection
        closes); charged to the ``wyoming`` key where keys are on."""
        keys = self.state.keys
        key = None if keys is None else ApiKey(WYOMING_KEY, b"", keys.default)
        return Caller(key=key, labels={"format": "pcm"}, gone=self.gone.wait,
                      voice=None if self.voice is None else self.voice.name)  # fmt: skip

    def _refused(self, caller: Caller, exc: TTSError) -> None:
        """Record a request refused before any audio, as every transport records one (once: an
        exchange that failed recorded itself)."""
        record_refusal(self.state, caller, exc.to_body(), exc.status)

    async def _end_audio(self) -> None:
        if not self.started:  # nothing was said: the client still learns the format
            await self._audio_start()
        await self._write(AudioStop(timestamp=round(1000 * self.sent_s)).event())

    async def _audio_start(self) -> None:
        assert self.voice is not None
        rate = self.state.native_rate(self.voice.name)
        await self._write(AudioStart(rate=rate, width=WIDTH, channels=CHANNELS).event())
        self.started = True

    async def _write(self, event: Event) -> None:
        try:
            await self.write_event(event)
        except (OSError, RuntimeError) as exc:  # RuntimeError: a transport already closed
            raise ConnectionGone from exc

    async def _synthesize(self, text: str, ssml: bool = False) -> None:
        """One request through the request core (``ssml``: ``text`` is an SSML document), its
        PCM sent as audio-chunk events as it comes."""
        assert self.voice is not None
        state = self.state
        order = SpeechOrder(text=text, voice=self.voice.name, speaker=self.voice.speaker,
                            format=FORMATS["pcm"], stream=True, api="wyoming",
                            sentence_silence=SENTENCE_SILENCE_S, ssml=ssml,
                            empty_text=self.empty_text)  # fmt: skip
        rate = state.native_rate(self.voice.name)
        caller = self._caller()
        try:
            exchange, first_msg = await start_exchange(state, order, caller)
        except TTSError as exc:
            self._refused(caller, exc)
            raise
        first = True
        try:
            async for encoded, _ in exchange.encoded(first_msg):
                if not (pcm := encoded):
                    continue
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
                                       timestamp=round(1000 * self.sent_s)).event()  # fmt: skip
                    if exchange.silent:  # nothing to speak: the data has room to say so
                        chunk.data["empty_text"] = True
                    await self._write(chunk)
                    self.sent_s += len(piece) / WIDTH / rate
        finally:
            exchange.finish("cancelled", cancel=True)  # no-op after a normal end
            exchange.release_encoder()
        if exchange.failure is not None:
            raise WorkerReportedError(exchange.failure)
