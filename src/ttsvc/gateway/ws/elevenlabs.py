"""ElevenLabs' streaming-input WebSockets, so voice-agent frameworks that speak ElevenLabs
(LiveKit's ``livekit-plugins-elevenlabs``, Pipecat's ``ElevenLabsTTSService``) can be pointed at
ttsvc by changing their base URL.

``/v1/text-to-speech/{voice_id}/multi-stream-input``: contexts (``context_id``) of text in as an
LLM writes it, audio with character alignment out; ``close_context`` ends one, ``close_socket``
all. ``/v1/text-to-speech/{voice_id}/stream-input`` is the older form with one implicit context
(``{"text": ""}`` ends it and the socket). Each context is cut into sentences
(``SentenceBuffer``) and each sentence is one synthesis request through the request core (the
same key quotas, slots, limits, metrics and one completion line as ``/synthesize``), spoken in
order; contexts are independent and may overlap. The wire format is ``elevenlabs_messages``.

A ``close_context`` right after an empty flush (how both frameworks end a turn) lets the context
finish: its text is spoken, then ``isFinal``. Any other ``close_context`` (how both signal a
barge-in) is an interruption: the sentence being synthesized is cancelled in its worker, the
rest dropped, and ``isFinal`` sent at once. A client that leaves, or ``close_socket``, cancels
everything: no worker keeps synthesizing for nobody. The session cap and the idle timeout are
every WebSocket route's (``handshake``); any message, the keep-alives ``{"text": ""}`` and
``{"text": " "}`` too, is activity.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from fastapi import FastAPI, WebSocket
from starlette.websockets import WebSocketDisconnect

from ttsvc.audio.encode import OutputFormat
from ttsvc.errors import (
    Busy,
    Draining,
    InvalidParameter,
    KeyStreamsExceeded,
    ShutDown,
    TextTooLong,
    TimestampsUnavailable,
    TTSError,
)
from ttsvc.gateway.core.caller import Caller
from ttsvc.gateway.core.elevenlabs import Alignment, Char, output_format, query_flag
from ttsvc.gateway.core.exchange import SynthesisExchange, WorkerReportedError, start_exchange
from ttsvc.gateway.core.idle import IdleClock, IdleConnection
from ttsvc.gateway.core.keys import ApiKey
from ttsvc.gateway.core.order import EmptyText, SpeechOrder, empty_text_mode
from ttsvc.gateway.core.records import record_refusal
from ttsvc.gateway.core.state import GatewayState
from ttsvc.gateway.ws.elevenlabs_messages import (
    AlignmentClock,
    ClientMessage,
    error_message,
    parse_message,
)
from ttsvc.gateway.ws.handshake import check_upgrade, refuse, take_seat, went_idle
from ttsvc.observability.logs import get_logger
from ttsvc.protocol import AudioChunkMsg
from ttsvc.ranges import SENTENCE_SILENCE, SPEED
from ttsvc.text.incremental import SentenceBuffer
from ttsvc.text.segment import ends_at_its_end

log = get_logger("elevenlabs_ws")

MULTI_PATH = "/v1/text-to-speech/{voice_id}/multi-stream-input"
SINGLE_PATH = "/v1/text-to-speech/{voice_id}/stream-input"
API = "elevenlabs"
MAX_CONTEXTS = 5
MAX_INACTIVITY_S = 180
"""The longest ``inactivity_timeout`` a client may ask for (ElevenLabs' own maximum)."""
"""Contexts open at once on one socket, as ElevenLabs allows."""
def inactivity(value: str | None, default: float) -> float:
    """The idle timeout a socket asked for with ``inactivity_timeout`` (whole seconds, 1 to
    ``MAX_INACTIVITY_S``, as ElevenLabs takes it), else the server's ``default``. Why honoured:
    agents written for ElevenLabs keep their socket between turns by asking for a longer one
    (LiveKit asks for 180 s), and a server that closed it sooner would break them."""
    if value is None:
        return default
    try:
        seconds = int(value)
    except ValueError:
        seconds = 0
    if not 1 <= seconds <= MAX_INACTIVITY_S:
        raise InvalidParameter(f"inactivity_timeout: whole seconds from 1 to "
                               f"{MAX_INACTIVITY_S}, not {value[:20]!r}",
                               field="inactivity_timeout")  # fmt: skip
    return float(seconds)


_SENTENCE_END = re.compile(r"[.!?…][\"'”’)\]]*$")
FATAL = {Draining.type: 1012, ShutDown.type: 1012}
"""Refusals after which the socket cannot go on, and the close code they end it with."""


class _Left(Exception):
    """The client is gone: a message could not be sent."""


@dataclass(frozen=True)
class _Options:
    """What a socket's query asks for, read before its voice is looked up."""

    fmt: OutputFormat
    rate: int
    idle_s: float
    empty_text: EmptyText
    per_context: bool
    auto: bool
    ssml: bool


@dataclass(eq=False)
class _Context:
    """One context: its text cut into sentences, spoken one after another by its task."""

    cid: str
    speed: float
    buffer: SentenceBuffer
    clock: AlignmentClock
    sentences: asyncio.Queue[tuple[str, float] | None] = field(default_factory=asyncio.Queue)
    """Sentences cut and not yet spoken, with when each was complete; ``None``: the end."""
    queued: int = 0
    """Characters in ``sentences``."""
    task: asyncio.Task[None] | None = None
    flushed: bool = False
    """Its last message was a flush without text: a ``close_context`` now ends a turn."""
    closing: bool = False
    final: bool = False
    """Its ``isFinal`` is being sent."""
    speaking: bool = False
    """One of its sentences is being synthesized or sent."""
    stopped: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when it is interrupted: a sentence queued in a worker for it is dropped."""
    samples: int = 0
    """Audio sent for it: where its next audio starts on its timeline."""
    spoken: int = 0
    tail: str = ""
    """The end of its text so far."""


class ElevenLabsSession:
    """One socket's life: read messages, keep the contexts, speak their sentences."""

    def __init__(self, state: GatewayState, ws: WebSocket, key: ApiKey | None, voice: str,
                 fmt: OutputFormat, rate: int, *, single: bool, per_context: bool,
                 timestamps: bool, idle_s: float | None = None,
                 auto: bool = False, empty_text: EmptyText = "silence",
                 ssml: bool = False) -> None:  # fmt: skip
        self.state = state
        self.ws = ws
        self.key = key
        self.voice = voice
        self.fmt = fmt
        self.rate = rate
        self.single = single
        self.per_context = per_context
        """Alignment times from the context's start (``sync_alignment=true``, LiveKit), else
        from the previous message's end (Pipecat)."""
        self.timestamps = timestamps
        self.auto = auto
        """ElevenLabs' ``auto_mode``: every text message is a whole unit, spoken at once."""
        self.empty_text: EmptyText = empty_text
        """A sentence with nothing to speak: a short silence, or (``error``) an error message."""
        self.ssml = ssml
        """ElevenLabs' ``enable_ssml_parsing``: each sentence's text is read as SSML (inline
        tags, which a client sends whole within a message, as ElevenLabs asks)."""
        self.sid = uuid.uuid4().hex
        self.contexts: dict[str, _Context] = {}
        self.opened = 0
        self.sentences = 0
        self.samples = 0
        self.silence = bytes(2 * round(SENTENCE_SILENCE * rate))
        """Between two sentences of one context, as between a text's sentences elsewhere."""
        self.live = 0
        """Exchanges of this socket under way."""
        self.settled = asyncio.Event()
        """Set whenever ``live`` drops to zero."""
        self.settled.set()
        self.idle = IdleClock(idle_s or state.settings.ws_idle_timeout_s, self._busy)
        self.gone = asyncio.Event()
        self.close_code: int | None = None
        self._send_lock = asyncio.Lock()

    def _busy(self) -> bool:
        """Whether a context has a sentence to speak or being spoken: the client waits."""
        return any(c.speaking or not c.sentences.empty() for c in self.contexts.values())

    # --- reading ---

    async def run(self) -> None:
        try:
            await self._read()
        except (_Left, WebSocketDisconnect):
            pass
        except IdleConnection:
            if self.close_code is None:  # else closed already, waiting on the client's reply
                await self._close(*went_idle(self.state, self.sid, "stream-input" if self.single
                                             else "multi-stream-input", self.idle.idle_s))
        finally:
            self.gone.set()
            tasks = [c.task for c in self.contexts.values() if c.task is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _read(self) -> None:
        while True:
            message = await self.idle.wait(self.ws.receive)  # any message, a keep-alive too
            if message["type"] == "websocket.disconnect":
                return
            raw = message.get("text")
            msg: ClientMessage | None = None
            try:
                if raw is None:
                    raise InvalidParameter("send JSON text messages, not binary ones",
                                           field="message")  # fmt: skip
                msg = parse_message(raw)
                if msg.close_socket:
                    await self._close(1000)
                    return
                await self._handle(msg)
            except TTSError as exc:
                cid = None if msg is None or self.single else msg.context_id
                await self._emit(error_message(exc, cid))

    async def _handle(self, msg: ClientMessage) -> None:
        text = msg.text or ""
        cid = "" if self.single else msg.context_id
        if cid is None:
            if text or msg.flush or msg.close_context:
                raise InvalidParameter("context_id: required on multi-stream-input (stream-input "
                                       "has one context)", field="context_id")  # fmt: skip
            return  # a keep-alive of the connection
        ctx = self.contexts.get(cid)
        if msg.close_context:
            if ctx is not None:
                await self._close_context(ctx)
            return
        if ctx is None:
            if not text and not msg.flush and msg.voice_settings is None and not self.single:
                return  # a keep-alive of a context that is not open
            ctx = self._open(cid, msg)
        elif ctx.closing:
            if text.strip() or msg.flush:
                raise InvalidParameter(f"context {cid[:64]!r} is closing: open another",
                                       field="context_id")  # fmt: skip
            return
        if self.single and msg.text == "" and not msg.flush:
            ctx.flushed = True  # the end of the input: speak the rest, then close
            await self._close_context(ctx)
            return
        if text:
            if _SENTENCE_END.search(ctx.tail) and text[0].isupper():
                text = " " + text  # sentences sent without the space between them (Pipecat)
            self._check_room(len(text))
            ctx.flushed = False
            ctx.tail = text[-8:]
            self._queue(ctx, ctx.buffer.append(text))
            if self.auto or ends_at_its_end(ctx.buffer.pending):
                # a whole unit (auto_mode), or a message that ends a sentence: speak it now
                # rather than when the next message shows the sentence has ended
                self._queue(ctx, ctx.buffer.flush())
        if msg.flush:
            self._queue(ctx, ctx.buffer.flush())
            ctx.flushed = not text

    def _open(self, cid: str, msg: ClientMessage) -> _Context:
        if len(self.contexts) >= MAX_CONTEXTS:
            raise InvalidParameter(f"at most {MAX_CONTEXTS} contexts may be open at once on one "
                                   "socket: close one first", field="context_id")  # fmt: skip
        settings = msg.voice_settings
        speed = settings.speed if settings is not None and settings.speed is not None else SPEED
        ctx = _Context(cid, speed, SentenceBuffer(self.state.settings.max_sentence_chars),
                       AlignmentClock(self.per_context))  # fmt: skip
        ctx.task = asyncio.ensure_future(self._speak_context(ctx))
        self.contexts[cid] = ctx
        self.opened += 1
        return ctx

    def _check_room(self, size: int) -> None:
        """Text waiting to be spoken is bounded per socket, as a request's text is."""
        limit = self.state.settings.max_text_chars
        waiting = sum(len(c.buffer.pending) + c.queued for c in self.contexts.values())
        if waiting + size > limit:
            raise TextTooLong(f"more than {limit} characters would wait to be spoken on this "
                              "socket: send more as the audio catches up",
                              field="text")  # fmt: skip

    def _queue(self, ctx: _Context, sentences: list[str]) -> None:
        now = time.perf_counter()
        for text in sentences:
            ctx.sentences.put_nowait((text, now))
            ctx.queued += len(text)

    async def _close_context(self, ctx: _Context) -> None:
        if ctx.flushed and not ctx.closing:  # the end of a turn: finish it
            ctx.closing = True
            self._queue(ctx, ctx.buffer.flush())
            ctx.sentences.put_nowait(None)
            return
        # an interruption: nobody will hear the rest
        ctx.closing = True
        ctx.stopped.set()
        if self.contexts.get(ctx.cid) is ctx:
            del self.contexts[ctx.cid]
        if ctx.task is not None:
            ctx.task.cancel()
            await asyncio.gather(ctx.task, return_exceptions=True)
        if not ctx.final:
            await self._emit(self._final(ctx))

    # --- speaking ---

    async def _speak_context(self, ctx: _Context) -> None:
        try:
            while (item := await ctx.sentences.get()) is not None:
                text, complete_at = item
                ctx.queued -= len(text)
                ctx.speaking = True
                try:
                    await self._sentence(ctx, text, complete_at)
                finally:
                    ctx.speaking = False
                    self.idle.touch()  # the idle time counts from the end of the last audio
            ctx.final = True
            await self._emit(self._final(ctx))
            if self.single:
                await self._close(1000)
        except (_Left, WebSocketDisconnect):
            self.gone.set()
        except Exception as exc:  # a bug here must not leave the client waiting on an open socket
            log.error("elevenlabs_session_failed", session=self.sid,
                      error=f"{type(exc).__name__}: {exc}")  # fmt: skip
            with contextlib.suppress(Exception):
                await self._emit(error_message(TTSError("internal error"), self._cid(ctx)))
            await self._close(1011)
        finally:
            if self.contexts.get(ctx.cid) is ctx:
                del self.contexts[ctx.cid]

    async def _left(self, ctx: _Context) -> None:
        """Returns once nobody waits for ``ctx``'s audio (interrupted, or the client left)."""
        waits = [asyncio.ensure_future(e.wait()) for e in (ctx.stopped, self.gone)]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    async def _sentence(self, ctx: _Context, text: str, complete_at: float) -> None:
        """Speak one sentence of ``ctx``; a refusal is recorded and sent as an error."""
        order = SpeechOrder(text=text, voice=self.voice, format=self.fmt, stream=True, api=API,
                            speed=ctx.speed, sample_rate=self.rate, timestamps=self.timestamps,
                            empty_text=self.empty_text, ssml=self.ssml)  # fmt: skip
        while True:
            # each try is a request of its own, recorded once (by its exchange or as refused)
            caller = Caller(started=complete_at, key=self.key, voice=order.voice,
                            labels={"format": self.fmt.name},
                            gone=functools.partial(self._left, ctx),
                            client_request_id=self.ws.headers.get("x-request-id"))  # fmt: skip
            try:
                exchange, first = await start_exchange(self.state, order, caller)
            except (Busy, KeyStreamsExceeded) as exc:
                if self.live:  # a key that may hold one stream: wait for this socket's own
                    await self.settled.wait()
                    continue
                await self._refused(ctx, caller, exc)
                return
            except TTSError as exc:
                await self._refused(ctx, caller, exc)
                return
            break
        self.live += 1
        self.settled.clear()
        try:
            await self._stream(ctx, text, exchange, first)
        finally:
            exchange.finish("cancelled", cancel=True)  # no-op after a normal end
            exchange.release_encoder()
            self.live -= 1
            if not self.live:
                self.settled.set()

    async def _refused(self, ctx: _Context, caller: Caller, exc: TTSError) -> None:
        record_refusal(self.state, caller, exc.to_body(), exc.status)
        await self._emit(error_message(exc, self._cid(ctx)))
        if (code := FATAL.get(exc.type)) is not None:
            await self._close(code)
            raise _Left("the socket is closed")

    async def _stream(self, ctx: _Context, text: str, exchange: SynthesisExchange,
                      first: AudioChunkMsg) -> None:  # fmt: skip
        if ctx.spoken and self.silence:  # the pause after the context's sentence before
            await self._audio(ctx, await _encode(exchange, self.silence), len(self.silence) // 2,
                              [])  # fmt: skip
        ctx.spoken += 1
        self.sentences += 1
        align = Alignment(text, self._ms(ctx.samples))
        async for data, msg in exchange.encoded(first):
            if msg is None:  # what the encoder held back, after the last chunk
                await self._audio(ctx, data, 0, align.rest(self._ms(ctx.samples)),
                                  empty=exchange.silent)  # fmt: skip
            else:
                samples = len(msg.pcm) // 2
                chars = align.words(msg.words, self._ms(ctx.samples + samples))
                await self._audio(ctx, data, samples, chars, empty=exchange.silent)
        if exchange.failure is not None:
            await self._emit(error_message(WorkerReportedError(exchange.failure),
                                           self._cid(ctx)))  # fmt: skip

    # --- sending ---

    def _ms(self, samples: int) -> float:
        return 1000 * samples / self.rate

    def _cid(self, ctx: _Context) -> str | None:
        return None if self.single else ctx.cid

    def _final(self, ctx: _Context) -> dict[str, object]:
        return {"isFinal": True, **({} if self.single else {"contextId": ctx.cid})}

    async def _audio(self, ctx: _Context, data: bytes, samples: int, chars: list[Char], *,
                     empty: bool = False) -> None:  # fmt: skip
        """Send one piece of ``ctx``'s audio (``samples`` long) with the characters it covers
        (``empty``: the short silence of a sentence with nothing to speak)."""
        alignment = ctx.clock.message(chars)
        ctx.samples += samples
        self.samples += samples
        if not data and alignment is None:
            return
        message: dict[str, object] = {
            "audio": base64.b64encode(data).decode("ascii") if data else None}
        if alignment is not None:
            # no normalization is applied to the text: both alignments are the same
            message["alignment"] = message["normalizedAlignment"] = alignment
        if not self.single:
            message["contextId"] = ctx.cid
        if empty:
            message["empty_text"] = True
        await self._emit(message)

    async def _emit(self, message: dict[str, object]) -> None:
        try:
            async with self._send_lock:
                await self.ws.send_text(json.dumps(message, separators=(",", ":")))
        except (WebSocketDisconnect, OSError, RuntimeError) as exc:
            self.gone.set()
            raise _Left(str(exc)) from exc

    async def _close(self, code: int, reason: str = "") -> None:
        if self.close_code is not None:
            return
        self.close_code = code
        async with self._send_lock:
            with contextlib.suppress(Exception):  # the client may have left meanwhile
                await self.ws.close(code, reason)


async def _encode(exchange: SynthesisExchange, pcm: bytes) -> bytes:
    """``pcm`` through the exchange's encoder, in its place before the sentence's audio (off the
    loop where encoding costs)."""
    encoder = exchange.encoder
    assert encoder is not None
    if encoder.light:
        return encoder.encode(pcm)
    return await asyncio.to_thread(encoder.encode, pcm)


def install(app: FastAPI, state: GatewayState) -> None:
    """Add both routes to ``app``."""

    async def serve(ws: WebSocket, voice_id: str, single: bool) -> None:
        started = time.perf_counter()
        xi_key = ws.headers.get("xi-api-key")
        timestamps = True
        caller = Caller(started=started)  # its record, if the upgrade is refused
        try:
            key = check_upgrade(state, ws, f"Bearer {xi_key}" if xi_key
                                else ws.headers.get("authorization"))  # fmt: skip
        except TTSError as exc:
            await refuse(state, ws, exc, caller)
            return
        options: _Options | InvalidParameter
        try:
            options = read_options(ws.query_params)  # before the voice: no wait for a bad query
        except InvalidParameter as exc:
            options = exc  # refused after the handshake, as ElevenLabs refuses it: 1008
        try:
            if isinstance(options, InvalidParameter):
                voice = voice_id  # to be refused anyway: not looked up, nor waited for
            else:
                voice = await state.resolve_voice(voice_id, caller)
                try:
                    state.require_durations(voice)
                except TimestampsUnavailable:
                    timestamps = False  # engines without durations: audio without alignment
            seat = take_seat(state)
        except TTSError as exc:
            await refuse(state, ws, exc, caller)
            return
        with seat:
            await ws.accept()
            await run(ws, key, voice, timestamps, single, started, options)

    def read_options(query: Mapping[str, str]) -> _Options:
        return _Options(*output_format(query.get("output_format")),
                        idle_s=inactivity(query.get("inactivity_timeout"),
                                          state.settings.ws_idle_timeout_s),
                        empty_text=empty_text_mode(query.get("empty_text")),
                        per_context=query_flag(query, "sync_alignment"),
                        auto=query_flag(query, "auto_mode"),
                        ssml=query_flag(query, "enable_ssml_parsing"))  # fmt: skip

    async def run(ws: WebSocket, key: ApiKey | None, voice: str, timestamps: bool,
                  single: bool, started: float,
                  options: _Options | InvalidParameter) -> None:  # fmt: skip
        if isinstance(options, InvalidParameter):
            caller = Caller(started=started, key=key, voice=voice)
            record_refusal(state, caller, options.to_body(), options.status)
            with contextlib.suppress(Exception):
                await ws.send_text(json.dumps(error_message(options, None)))
                await ws.close(1008)
            return
        fmt, rate = options.fmt, options.rate
        session = ElevenLabsSession(state, ws, key, voice, fmt, rate, single=single,
                                    per_context=options.per_context, timestamps=timestamps,
                                    idle_s=options.idle_s, auto=options.auto,
                                    empty_text=options.empty_text,
                                    ssml=options.ssml)  # fmt: skip
        try:
            await session.run()
        finally:
            log.info("elevenlabs_session", session=session.sid, route="single" if single
                     else "multi", key=None if key is None else key.name, voice=voice,
                     output_format=f"{fmt.name}_{rate}", contexts=session.opened,
                     sentences=session.sentences, audio_s=round(session.samples / rate, 3),
                     duration_ms=round(1000 * (time.perf_counter() - started), 1),
                     close_code=session.close_code,
                     client_left=session.close_code is None)  # fmt: skip

    async def multi(ws: WebSocket, voice_id: str) -> None:
        await serve(ws, voice_id, single=False)

    async def single(ws: WebSocket, voice_id: str) -> None:
        await serve(ws, voice_id, single=True)

    app.add_api_websocket_route(MULTI_PATH, multi)
    app.add_api_websocket_route(SINGLE_PATH, single)
