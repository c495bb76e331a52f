"""``/synthesize/stream``: text over a WebSocket as an LLM writes it, audio back as it is made.

Runs on the gateway's event loop. Each sentence is spoken as soon as it is complete (text after
its end arrived) or flushed, and each one is one synthesis request on the path ``/synthesize``
takes (``start_exchange``): the same key quotas, slots, text cap, drain, metrics and one
completion log line each, so a session costs what its sentences sent one by one would.

The protocol (JSON text messages; the first may configure the session):

client → server
    ``{"type": "start", "voice"?, "speaker"?, "speed"?, "noise_scale"?, "noise_w"?,
    "sentence_silence"?, "sample_rate"?}`` (optional, first; the fields of ``/synthesize``),
    ``{"type": "append", "text": "..."}``, ``{"type": "flush"}`` (speak what is pending now),
    ``{"type": "end"}`` (flush, and close once the last audio is sent).
server → client
    ``{"type": "started", "session", "sample_rate", "encoding": "pcm_s16le", "voice"}``;
    ``{"type": "audio", "sentence", "offset", "audio"}``: base64 PCM16 mono, ``offset`` its first
    sample's index from the session's start (at ``sample_rate``), with ``"words"`` where the
    worker's chunk carries word timestamps (``chunk_words``); ``{"type": "flushed",
    "sentences", "offset"}`` once everything before a flush was sent; ``{"type": "done",
    "sentences", "offset", "audio_s"}`` after ``end``, then close 1000; ``{"type": "error",
    "error", "code", "status", "field"?, "sentence"?}``.

A bad message gets an error naming its field and is otherwise ignored; a sentence that cannot
be spoken gets an error with its index and the session goes on. A shutdown ends a session with
an error and close 1012 (service restart), after the audio of sentences already under way.

Keys: ``Authorization: Bearer`` where the client can set headers; a browser offers the
subprotocols ``ttsvc`` and ``bearer.<key>`` instead (never a query string: it would land in
access logs). The server answers ``ttsvc``. CORS does not cover WebSockets, so a browser page
of another origin is refused unless ``--cors-origin`` allows it, as it is kept from the HTTP API.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from fastapi import FastAPI, WebSocket
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, RootModel, ValidationError
from starlette.websockets import WebSocketDisconnect

from ttsvc.audio.encode import FORMATS
from ttsvc.errors import (
    Busy,
    Draining,
    InvalidParameter,
    KeyStreamsExceeded,
    OriginNotAllowed,
    TextTooLong,
    TTSError,
    Unauthorized,
)
from ttsvc.gateway.app import (
    GatewayState,
    SpeechOrder,
    SynthesisExchange,
    VoiceSettings,
    WorkerReportedError,
    _rate,
    record_refusal,
    start_exchange,
)
from ttsvc.observability.logs import get_logger
from ttsvc.protocol import AudioChunkMsg
from ttsvc.text.incremental import SentenceBuffer

log = get_logger("stream_ws")

PATH = "/synthesize/stream"
SUBPROTOCOL = "ttsvc"
BEARER = "bearer."
"""Prefix of the subprotocol that carries a key (``bearer.<key>``)."""
LOOKAHEAD = 2
"""Sentences of one session dispatched at once: the one streaming and the next, which the
worker computes meanwhile so its first audio is ready when the one before ends."""
API = "websocket"
FATAL = {"draining": 1012, "shutdown": 1012}
"""Errors after which the session cannot go on, and the close code they end it with."""

SpeakerOf = Callable[[str, int | str | None], Awaitable[int | None]]


class StartMessage(VoiceSettings):
    """Session settings: the fields of ``POST /synthesize`` that are not the text
    (``sentence_silence``: between sentences spoken without a flush between them)."""

    type: Literal["start"]
    timestamps: bool = False
    """Audio messages carry the words whose audio starts in them (``{word, start, end,
    text_span}``, on the session's timeline and into its whole text)."""


class AppendMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["append"]
    text: str


class FlushMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["flush"]


class EndMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["end"]


ClientMessage = Annotated[
    StartMessage | AppendMessage | FlushMessage | EndMessage, Field(discriminator="type")
]


class _Message(RootModel[ClientMessage]):
    pass


def parse_message(raw: str) -> ClientMessage:
    """A client message, or ``InvalidParameter`` naming the field at fault."""
    try:
        return _Message.model_validate_json(raw).root
    except ValidationError as exc:
        first = exc.errors()[0]
        kind = first.get("type", "")
        if kind == "json_invalid":
            raise InvalidParameter("the message is not valid JSON", field="message") from None
        if kind in ("union_tag_not_found", "union_tag_invalid", "model_attributes_type"):
            raise InvalidParameter('"type" must be one of start, append, flush, end',
                                   field="type") from None  # fmt: skip
        # loc starts with the message type (the union's tag)
        name = ".".join(str(p) for p in first.get("loc", ())[1:]) or "message"
        raise InvalidParameter(f"{name}: {first.get('msg', 'invalid')}", field=name) from None


def error_message(exc: TTSError, sentence: int | None = None) -> dict[str, object]:
    """The ``error`` message: an HTTP error body's ``error`` and ``field``, its ``type`` as
    ``code`` (``type`` names the message here) and the status HTTP would have answered."""
    message: dict[str, object] = {"type": "error", "error": exc.message, "code": exc.type,
                                  "status": exc.status}  # fmt: skip
    if exc.field is not None:
        message["field"] = exc.field
    if sentence is not None:
        message["sentence"] = sentence
    return message


@dataclass(frozen=True)
class _Sentence:
    index: int
    text: str
    at: int
    """Where it starts in the session's text (all its appends, joined)."""
    after_flush: bool
    """First of its turn (the session's first, or the first after a flush): no silence before."""
    complete_at: float
    """When it became complete (``perf_counter``): latency of a refusal counts from here."""


@dataclass(frozen=True)
class _Mark:
    """A flush or the end, kept in its place among the sentences."""

    kind: Literal["flushed", "done"]
    sentences: int
    """Sentences cut before it."""


@dataclass(frozen=True)
class _Started:
    sentence: _Sentence
    exchange: SynthesisExchange
    first: AudioChunkMsg


@dataclass(frozen=True)
class _Refused:
    sentence: _Sentence
    error: TTSError


class StreamSession:
    """One WebSocket's life: read messages, cut sentences, dispatch them, send audio in order.

    Three tasks on the gateway's loop: the reader (messages → sentences), the dispatcher
    (sentences → exchanges, ``LOOKAHEAD`` at a time) and the sender (exchanges → audio
    messages, in sentence order). Whatever way the session ends, every exchange it holds is
    finished, and cancelled in its worker if it was not done.
    """

    def __init__(self, state: GatewayState, ws: WebSocket, speaker_of: SpeakerOf) -> None:
        self.state = state
        self.ws = ws
        self.speaker_of = speaker_of
        self.sid = uuid.uuid4().hex
        self.buffer = SentenceBuffer(state.settings.max_sentence_chars)
        self.template: SpeechOrder | None = None
        self.rate = 22050
        self.silence = b""
        self.sentences = 0
        """Sentences cut so far (the next one's index)."""
        self.turn_start = True
        self.unplaced = ""
        """The session's text after the last sentence cut (the sentences are found in it)."""
        self.unplaced_at = 0
        """Where ``unplaced`` starts in the session's text."""
        self.offset = 0
        """Samples sent so far."""
        self.spoken_s = 0.0
        self.ended = False
        self.items: asyncio.Queue[_Sentence | _Mark] = asyncio.Queue()
        self.backlog = 0
        """Characters of sentences cut and not yet dispatched."""
        self.room = asyncio.Event()
        """Set when the dispatcher takes a sentence (the backlog shrank)."""
        self.out: asyncio.Queue[_Started | _Refused | _Mark] = asyncio.Queue()
        self.slots = asyncio.Semaphore(LOOKAHEAD)
        self.live: set[SynthesisExchange] = set()
        """Exchanges dispatched and not yet sent whole."""
        self.settled = asyncio.Event()
        """Set whenever ``live`` empties."""
        self.settled.set()
        self.gone = asyncio.Event()
        self.close_code: int | None = None
        self._send_lock = asyncio.Lock()

    # --- the three tasks ---

    async def run(self) -> None:
        reader, _dispatcher, sender = tasks = [
            asyncio.ensure_future(c) for c in (self._read(), self._dispatch(), self._send())
        ]
        try:
            pending: set[asyncio.Future[None]] = set(tasks)
            while reader in pending and sender in pending:  # the dispatcher may end first
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                failed = [exc for task in done if (exc := task.exception()) is not None
                          and not isinstance(exc, WebSocketDisconnect)]  # fmt: skip
                if failed:
                    # a bug here must not leave the client waiting on an open socket
                    log.error("websocket_session_failed", session=self.sid,
                              error=f"{type(failed[0]).__name__}: {failed[0]}")  # fmt: skip
                    with contextlib.suppress(Exception):
                        await self._emit(error_message(TTSError("internal error")))
                    await self._close(1011)
                    return
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for exchange in list(self.live):
                exchange.finish("cancelled", cancel=True)  # no-op for one that ended
                exchange.release_encoder()
            while not self.out.empty():  # dispatched, never taken by the sender
                item = self.out.get_nowait()
                if isinstance(item, _Started):
                    item.exchange.finish("cancelled", cancel=True)
                    item.exchange.release_encoder()

    async def _read(self) -> None:
        try:
            await self._read_messages()
        except WebSocketDisconnect:  # an error message could not be sent: the client left
            pass
        self.gone.set()

    async def _read_messages(self) -> None:
        """Read until the client leaves."""
        limit = self.state.settings.max_text_chars
        while True:
            # text far ahead of the audio is not read: the server reads no more from the socket
            # until the client's text fits a request's cap again (TCP pushes back on the client)
            while self.backlog > limit:
                self.room.clear()
                await self.room.wait()
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            raw = message.get("text")
            if raw is None:
                await self._emit(error_message(InvalidParameter(
                    "send JSON text messages, not binary ones", field="message")))  # fmt: skip
                continue
            try:
                await self._handle(parse_message(raw))
            except TTSError as exc:
                await self._emit(error_message(exc))

    async def _handle(self, msg: StartMessage | AppendMessage | FlushMessage | EndMessage) -> None:
        if self.ended:
            raise InvalidParameter("the session has ended: no message is read after end",
                                   field="type")  # fmt: skip
        if isinstance(msg, StartMessage):
            if self.template is not None:
                raise InvalidParameter("start must be the first message", field="type")
            await self._configure(msg)
            return
        if self.template is None:
            await self._configure(StartMessage(type="start"))
        if isinstance(msg, AppendMessage):
            limit = self.state.settings.max_text_chars
            if len(msg.text) > limit:
                raise TextTooLong(f"text is over {limit} characters", field="text")
            self.unplaced += msg.text
            self._queue(self.buffer.append(msg.text))
            return
        self._queue(self.buffer.flush())
        if isinstance(msg, EndMessage):
            self.ended = True
            self.items.put_nowait(_Mark("done", self.sentences))
        else:
            self.items.put_nowait(_Mark("flushed", self.sentences))
            self.turn_start = True

    async def _configure(self, msg: StartMessage) -> None:
        self.ws.state.format = "pcm"
        fmt = FORMATS["pcm"]
        voice = self.state.resolve_voice(msg.voice)
        if msg.timestamps:
            self.state.require_durations(voice)
        template = SpeechOrder("", msg.speed, msg.noise_scale, msg.noise_w, msg.sentence_silence,
                               _rate(fmt, msg.sample_rate), fmt, True, API, voice,
                               await self.speaker_of(voice, msg.speaker),
                               timestamps=msg.timestamps)  # fmt: skip
        self.rate = template.sample_rate or self.state.native_rate(voice)
        self.silence = bytes(2 * round(msg.sentence_silence * self.rate))
        self.template = template
        await self._emit({"type": "started", "session": self.sid, "sample_rate": self.rate,
                          "encoding": "pcm_s16le", "voice": voice})  # fmt: skip

    def _queue(self, sentences: list[str]) -> None:
        now = time.perf_counter()
        for text in sentences:
            # a sentence is a stripped piece of the text, in order: it is found from the last
            found = max(self.unplaced.find(text), 0)
            at = self.unplaced_at + found
            self.unplaced = self.unplaced[found + len(text):]
            self.unplaced_at = at + len(text)
            self.items.put_nowait(_Sentence(self.sentences, text, at, self.turn_start, now))
            self.backlog += len(text)
            self.sentences += 1
            self.turn_start = False

    async def _dispatch(self) -> None:
        while True:
            item = await self.items.get()
            if isinstance(item, _Mark):
                self.out.put_nowait(item)
                continue
            await self.slots.acquire()
            self.backlog -= len(item.text)
            self.room.set()
            started = await self._start(item)
            self.out.put_nowait(started)
            if isinstance(started, _Refused) and started.error.type in FATAL:
                return  # the session ends with this refusal: nothing after it is tried

    async def _start(self, sentence: _Sentence) -> _Started | _Refused:
        """Dispatch one sentence; a refusal is recorded as HTTP records one. A session's own
        next sentence refused for a slot its previous one holds waits for that one instead."""
        assert self.template is not None
        order = dataclasses.replace(self.template, text=sentence.text)
        while True:
            self.ws.state.recorded = False  # set once an exchange recorded its own failure
            try:
                exchange, first = await start_exchange(self.state, order, self.ws,
                                                       self.gone.wait)  # fmt: skip
            except (Busy, KeyStreamsExceeded) as exc:
                if self.live:
                    await self.settled.wait()
                    continue
                return self._refused(sentence, exc)
            except TTSError as exc:
                return self._refused(sentence, exc)
            self.live.add(exchange)
            self.settled.clear()
            return _Started(sentence, exchange, first)

    def _refused(self, sentence: _Sentence, exc: TTSError) -> _Refused:
        if not getattr(self.ws.state, "recorded", False):
            record_refusal(self.state, self.ws, exc.to_body(), exc.status,
                           sentence.complete_at, len(sentence.text))  # fmt: skip
        return _Refused(sentence, exc)

    async def _send(self) -> None:
        try:
            while True:
                item = await self.out.get()
                if isinstance(item, _Mark):
                    await self._emit({"type": item.kind, "sentences": item.sentences,
                                      "offset": self.offset,
                                      **({"audio_s": round(self.spoken_s, 3)}
                                         if item.kind == "done" else {})})  # fmt: skip
                    if item.kind == "done":
                        await self._close(1000)
                        return
                    continue
                try:
                    failure = await self._speak(item)
                finally:
                    self.slots.release()
                if failure is not None:
                    await self._emit(error_message(failure, sentence=item.sentence.index))
                    if (code := FATAL.get(failure.type)) is not None:
                        await self._close(code)
                        return
        except WebSocketDisconnect:
            self.gone.set()

    async def _speak(self, item: _Started | _Refused) -> TTSError | None:
        """Send one sentence's audio; returns why it failed, if it did."""
        if isinstance(item, _Refused):
            return item.error
        exchange, sentence = item.exchange, item.sentence
        try:
            if not sentence.after_flush and self.silence:
                await self._audio(sentence, self.silence, None, 0)
            start = self.offset
            await self._audio(sentence, item.first.pcm, item.first, start)
            async for msg in exchange.rest():
                exchange.received(msg)
                await self._audio(sentence, msg.pcm, msg, start)
        finally:
            exchange.finish("cancelled", cancel=True)  # no-op after a normal end
            exchange.release_encoder()
            self.spoken_s += exchange.audio_s
            self.live.discard(exchange)
            if not self.live:
                self.settled.set()
        return None if exchange.failure is None else WorkerReportedError(exchange.failure)

    # --- sending ---

    async def _audio(self, sentence: _Sentence, pcm: bytes, chunk: AudioChunkMsg | None,
                     start: int) -> None:  # fmt: skip
        """Send one chunk of ``sentence``, whose own audio began at sample ``start``."""
        message: dict[str, object] = {"type": "audio", "sentence": sentence.index,
                                      "offset": self.offset,
                                      "audio": base64.b64encode(pcm).decode("ascii")}  # fmt: skip
        if chunk is not None and (words := chunk_words(chunk, start / self.rate, sentence.at)):
            message["words"] = words
        self.offset += len(pcm) // 2
        await self._emit(message)

    async def _emit(self, message: dict[str, object]) -> None:
        async with self._send_lock:
            await self.ws.send_text(json.dumps(message, separators=(",", ":")))

    async def _close(self, code: int) -> None:
        self.close_code = code
        async with self._send_lock:
            with contextlib.suppress(Exception):  # the client may have left meanwhile
                await self.ws.close(code)


def chunk_words(chunk: AudioChunkMsg, start_s: float, at: int) -> list[dict[str, Any]]:
    """The word timestamps a worker's chunk carries (none without them), moved from its
    sentence's own timeline and text to the session's: a word's ``start`` and ``end`` are
    seconds from its stream's first sample, so ``start_s`` (where the sentence's audio began in
    the session) is added, and its ``text_span`` indexes the sentence's text, so ``at`` (where
    the sentence began in the session's text) is added."""
    out: list[dict[str, Any]] = []
    for word in getattr(chunk, "words", ()):
        is_record = dataclasses.is_dataclass(word) and not isinstance(word, type)
        entry = dict(dataclasses.asdict(word) if is_record else word)
        for edge in ("start", "end"):
            if isinstance(entry.get(edge), (int, float)):
                entry[edge] = round(entry[edge] + start_s, 6)
        span = entry.get("text_span")
        if isinstance(span, (list, tuple)) and len(span) == 2:
            entry["text_span"] = [span[0] + at, span[1] + at]
        out.append(entry)
    return out


def _origin_allowed(origin: str, host: str | None, allowed: list[str]) -> bool:
    """Whether a browser page of ``origin`` may open a session: one served by this host (the
    try-it page), or one that CORS lets read the HTTP API. A client that is not a browser sends
    no ``Origin`` and is not asked."""
    if "*" in allowed or origin in allowed:
        return True
    return host is not None and urlsplit(origin).netloc.lower() == host.lower()


def install(app: FastAPI, state: GatewayState, speaker_of: SpeakerOf) -> None:
    """Add the route to ``app`` (``speaker_of``: the app's speaker resolution)."""

    async def stream(ws: WebSocket) -> None:
        started = time.perf_counter()
        offered = list(ws.scope.get("subprotocols", ()))
        try:
            if state.draining:
                raise Draining("the server is shutting down")
            origin = ws.headers.get("origin")
            if origin is not None and not _origin_allowed(origin, ws.headers.get("host"),
                                                          state.settings.cors_origins):
                raise OriginNotAllowed(f"origin {origin[:200]!r} may not open this WebSocket: "
                                       "--cors-origin names the origins that may")  # fmt: skip
            if state.keys is not None:
                token = next((p[len(BEARER):] for p in offered if p.startswith(BEARER)), None)
                header = ws.headers.get("authorization")
                key = state.keys.authenticate(header or (f"Bearer {token}" if token else None))
                ws.state.key = key
                ws.state.key_name = key.name
        except (Draining, OriginNotAllowed, Unauthorized) as exc:
            record_refusal(state, ws, exc.to_body(), exc.status, started, None)
            reply = JSONResponse(exc.to_body(), status_code=exc.status, headers=exc.headers())
            try:
                await ws.send_denial_response(reply)
            except RuntimeError:  # a server without the denial extension
                await ws.close(1008)
            return
        await ws.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
        session = StreamSession(state, ws, speaker_of)
        state.metrics.websocket_sessions.inc()
        try:
            await session.run()
        finally:
            state.metrics.websocket_sessions.dec()
            log.info("websocket_session", session=session.sid,
                     key=getattr(ws.state, "key_name", None), sentences=session.sentences,
                     audio_s=round(session.spoken_s, 3),
                     duration_ms=round(1000 * (time.perf_counter() - started), 1),
                     close_code=session.close_code,
                     client_left=session.close_code is None and session.gone.is_set())  # fmt: skip

    app.add_api_websocket_route(PATH, stream)
