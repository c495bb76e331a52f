"""One ``/synthesize/stream`` session (``stream_ws``): the reader, dispatcher and sender tasks
that turn a WebSocket's messages into sentences, synthesis requests and audio messages.

It exists apart from the route (``stream_ws``, which admits a WebSocket and runs a session on
it) and the wire format (``stream_ws_messages``) so the session's life can be read on its own.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import time
import uuid
from dataclasses import dataclass
from typing import Literal

from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect

from ttsvc.audio.encode import FORMATS
from ttsvc.errors import (
    Busy,
    Draining,
    InvalidParameter,
    KeyStreamsExceeded,
    ShutDown,
    TextTooLong,
    TTSError,
)
from ttsvc.gateway.core.caller import Caller
from ttsvc.gateway.core.exchange import SynthesisExchange, WorkerReportedError, start_exchange
from ttsvc.gateway.core.idle import IdleClock, IdleConnection
from ttsvc.gateway.core.keys import ApiKey
from ttsvc.gateway.core.order import SpeechOrder
from ttsvc.gateway.core.records import record_refusal
from ttsvc.gateway.core.state import GatewayState
from ttsvc.gateway.ws.handshake import went_idle
from ttsvc.gateway.ws.messages import (
    AppendMessage,
    EndMessage,
    FlushMessage,
    StartMessage,
    chunk_words,
    error_message,
    parse_message,
)
from ttsvc.observability.logs import get_logger
from ttsvc.protocol import AudioChunkMsg
from ttsvc.text.incremental import SentenceBuffer
from ttsvc.text.ssml import is_ssml
from ttsvc.voice import SAMPLE_RATE

log = get_logger("stream_ws")

LOOKAHEAD = 2
"""Sentences of one session dispatched at once: the one streaming and the next, which the
worker computes meanwhile so its first audio is ready when the one before ends."""
API = "websocket"
FATAL = {Draining.type: 1012, ShutDown.type: 1012}
"""Errors after which the session cannot go on, and the close code they end it with."""

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
    ssml: bool = False
    """An SSML document (one append), said as one request."""


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

    def __init__(self, state: GatewayState, ws: WebSocket, key: ApiKey | None) -> None:
        self.state = state
        self.ws = ws
        self.key = key
        """The key the session authenticated with: each sentence is a request charged to it."""
        self.sid = uuid.uuid4().hex
        self.buffer = SentenceBuffer(state.settings.max_sentence_chars)
        self.template: SpeechOrder | None = None
        self.ssml: bool | None = None
        """Appends are SSML documents (``True``), text (``False``), or as each starts."""
        self.rate = SAMPLE_RATE
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
        self.unsent = 0
        """Sentences cut whose audio is not all sent (or refusal told): the client waits."""
        self.idle = IdleClock(state.settings.ws_idle_timeout_s, lambda: self.unsent > 0)
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
        except IdleConnection:
            await self._close(*went_idle(self.state, self.sid, "stream"))
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
            message = await self.idle.wait(self.ws.receive)  # any message, a keep-alive too
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
            if self._is_document(msg.text):  # said whole, after what was pending before it
                self._queue(self.buffer.flush())
                self.unplaced += msg.text
                self._queue([msg.text], ssml=True)
                return
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
        fmt = FORMATS["pcm"]
        voice = await self.state.resolve_voice(msg.voice)
        if msg.timestamps:
            self.state.require_durations(voice)
        speaker = await self.state.speaker_of(voice, msg.speaker)
        self.ssml = msg.ssml
        template = SpeechOrder.from_settings(msg.model_copy(update={"ssml": None}), text="",
                                             voice=voice, speaker=speaker,
                                             format=fmt, stream=True, api=API,
                                             timestamps=msg.timestamps)  # fmt: skip
        self.rate = template.sample_rate or self.state.native_rate(voice)
        self.silence = bytes(2 * round(msg.sentence_silence * self.rate))
        self.template = template
        await self._emit({"type": "started", "session": self.sid, "sample_rate": self.rate,
                          "encoding": "pcm_s16le", "voice": voice})  # fmt: skip

    def _is_document(self, text: str) -> bool:
        """Whether an append is an SSML document: as ``start`` said (``ssml``), else if it
        starts with ``<speak``. One document per append: markup cut across appends cannot be
        read before its end, which would hold back the audio of everything before it."""
        if self.ssml is None or not text.strip():  # whitespace: a keep-alive, not a document
            return is_ssml(text)
        if self.ssml and not is_ssml(text):
            raise InvalidParameter("the session reads SSML (ssml: true): each append must be "
                                   "one document starting with <speak", field="text")  # fmt: skip
        return self.ssml

    def _queue(self, sentences: list[str], ssml: bool = False) -> None:
        now = time.perf_counter()
        for text in sentences:
            # a sentence is a stripped piece of the text, in order: it is found from the last
            found = max(self.unplaced.find(text), 0)
            at = self.unplaced_at + found
            self.unplaced = self.unplaced[found + len(text):]
            self.unplaced_at = at + len(text)
            self.items.put_nowait(_Sentence(self.sentences, text, at, self.turn_start, now,
                                            ssml))  # fmt: skip
            self.backlog += len(text)
            self.sentences += 1
            self.unsent += 1
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
        order = dataclasses.replace(self.template, text=sentence.text, ssml=sentence.ssml)
        while True:
            # each try is a request of its own, recorded once (by its exchange or as refused)
            caller = Caller(started=sentence.complete_at, key=self.key, voice=order.voice,
                            labels={"format": "pcm"}, gone=self.gone.wait,
                            client_request_id=self.ws.headers.get("x-request-id"))  # fmt: skip
            try:
                exchange, first = await start_exchange(self.state, order, caller)
            except (Busy, KeyStreamsExceeded) as exc:
                if self.live:
                    await self.settled.wait()
                    continue
                return self._refused(sentence, caller, exc)
            except TTSError as exc:
                return self._refused(sentence, caller, exc)
            self.live.add(exchange)
            self.settled.clear()
            return _Started(sentence, exchange, first)

    def _refused(self, sentence: _Sentence, caller: Caller, exc: TTSError) -> _Refused:
        caller.text_len = len(sentence.text)
        record_refusal(self.state, caller, exc.to_body(), exc.status)  # once: see Caller.recorded
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
                    self.unsent -= 1
                    self.idle.touch()  # the idle time counts from the end of the last audio
                if failure is not None:
                    await self._emit(error_message(failure, sentence=item.sentence.index))
                    if (code := FATAL.get(failure.type)) is not None:
                        await self._close(code)
                        return
        except WebSocketDisconnect:
            self.gone.set()

    @property
    def spoken_s(self) -> float:
        """Audio sent so far, the pauses between sentences included: what the client plays."""
        return self.offset / self.rate

    async def _speak(self, item: _Started | _Refused) -> TTSError | None:
        """Send one sentence's audio; returns why it failed, if it did."""
        if isinstance(item, _Refused):
            return item.error
        exchange, sentence = item.exchange, item.sentence
        try:
            if not sentence.after_flush and self.silence:
                await self._audio(sentence, self.silence, None, 0)
            start = self.offset
            await self._audio(sentence, item.first.pcm, item.first, start, empty=exchange.silent)
            async for msg in exchange.rest():
                exchange.received(msg)
                await self._audio(sentence, msg.pcm, msg, start)
        finally:
            exchange.finish("cancelled", cancel=True)  # no-op after a normal end
            exchange.release_encoder()
            self.live.discard(exchange)
            if not self.live:
                self.settled.set()
        return None if exchange.failure is None else WorkerReportedError(exchange.failure)

    # --- sending ---

    async def _audio(self, sentence: _Sentence, pcm: bytes, chunk: AudioChunkMsg | None,
                     start: int, *, empty: bool = False) -> None:  # fmt: skip
        """Send one chunk of ``sentence``, whose own audio began at sample ``start``
        (``empty``: the short silence of a sentence with nothing to speak)."""
        message: dict[str, object] = {"type": "audio", "sentence": sentence.index,
                                      "offset": self.offset,
                                      "audio": base64.b64encode(pcm).decode("ascii")}  # fmt: skip
        if empty:
            message["empty_text"] = True
        if chunk is not None and (words := chunk_words(chunk, start / self.rate, sentence.at)):
            message["words"] = [w for w in words if "mark" not in w]
            if marks := [w for w in words if "mark" in w]:
                message["marks"] = marks
        self.offset += len(pcm) // 2
        await self._emit(message)

    async def _emit(self, message: dict[str, object]) -> None:
        async with self._send_lock:
            await self.ws.send_text(json.dumps(message, separators=(",", ":")))

    async def _close(self, code: int, reason: str = "") -> None:
        self.close_code = code
        async with self._send_lock:
            with contextlib.suppress(Exception):  # the client may have left meanwhile
                await self.ws.close(code, reason)
