"""One synthesis request's life on the gateway: admitted, dispatched, accounted, finished once.

Every API's synthesis (the HTTP routes, the WebSocket, Wyoming) is admitted and sent to a worker
by ``start_exchange``, and the ``SynthesisExchange`` it returns holds what the request holds (a
stream slot, a key's quota claim, a mailbox, an encoder) until ``finish`` releases it all and
writes the request's one completion log line, however the request ends.

A request with nothing to speak is an exchange too, a silent one: its audio is ``SILENCE_S`` of
zeros made here and encoded like any audio, so every transport answers it in the format and
rate asked for, through its own path, and agent frameworks get the audio frame they wait for
(an error, or a 200 with no audio, fails or stalls their turn). Admission knows most such texts
at once (no worker is asked); the worker finds the rest and says so before any audio.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

from ttsvc.audio.encode import Encoder
from ttsvc.errors import (
    ClientClosedRequest,
    NothingToSay,
    QueueTimeout,
    TTSError,
    WorkerStalled,
)
from ttsvc.gateway.core.admission import admit, close_later
from ttsvc.gateway.core.caller import Caller
from ttsvc.gateway.core.order import SpeechOrder
from ttsvc.gateway.core.quotas import Ticket
from ttsvc.gateway.core.script import compose
from ttsvc.gateway.core.state import GatewayState
from ttsvc.observability.logs import get_logger
from ttsvc.pool.supervisor import Mailbox, WorkerPool
from ttsvc.protocol import AudioChunkMsg, StreamDone, StreamError, SynthesisJob
from ttsvc.voice import SAMPLE_RATE

log = get_logger("gateway")

SILENCE_S = 0.05
"""The audio of a request with nothing to speak: one frame long enough for any codec and for
the agent frameworks (LiveKit's and Pipecat's) to take it as a turn's audio."""


class SynthesisExchange:
    """One request's life on the gateway: admitted, dispatched, streamed, finished exactly once.

    Finishing releases the admission slot and the mailbox, tells the worker to stop if the client
    left early, and writes the request's one completion log line. It is idempotent, so the
    normal end, an error, a disconnect and the drain can all call it.
    """

    def __init__(
        self,
        state: GatewayState,
        caller: Caller,
        pool: WorkerPool | None,
        wid: int | None,
        job: SynthesisJob,
        qsize: int,
        silence_if_empty: bool = True,
    ) -> None:
        self.state = state
        self.caller = caller
        self.buffered = False
        """A ``stream: false`` request: nothing is sent before the end, so a failure is its code."""
        self.pool = pool
        self.wid = wid
        self.job = job
        self.qsize = qsize
        self.started = time.perf_counter()
        self.box: Mailbox | None = None
        self.first_audio_s: float | None = None
        self.failure: StreamError | None = None
        """Set when the stream failed after the first audio (it cannot finish)."""
        self.rate = SAMPLE_RATE
        """Output sample rate, for turning bytes into playback time."""
        self.audio_s = 0.0
        self.compute_s: float | None = None
        self.engine_version: str | None = None
        self._last_chunk: float | None = None
        self._finished = False
        self.ticket: Ticket | None = None
        """The key's quota claim, settled with the audio really produced."""
        self.encoder: Encoder | None = None
        self.silence_if_empty = silence_if_empty
        """Nothing to speak is answered with silence (the order's ``empty_text``)."""
        self.silent = False
        """Nothing was spoken: its audio is ``SILENCE_S`` of zeros, its completion line says
        ``empty_text`` with a 200; the transports say so (a header, a field)."""
        state.inflight += 1
        state.idle.clear()
        state.aborts[self] = self.abort

    async def first(self, timeout: float) -> AudioChunkMsg:
        """Dispatch and wait for the first audio; a failure before it becomes an HTTP error.

        The client is watched meanwhile: one that leaves while its request is queued gets it
        cancelled in the worker (dropped from its queue, never synthesized) and is recorded as
        499, not left to be synthesized for nobody.
        """
        assert self.pool is not None and self.wid is not None
        self.box = await self.pool.submit(self.wid, self.job)
        audio = asyncio.ensure_future(self.box.get())
        gone = asyncio.ensure_future(self.caller.gone())
        try:
            done, _ = await asyncio.wait({audio, gone}, timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        except asyncio.CancelledError:
            self.finish("cancelled", cancel=True)
            raise
        finally:
            audio.cancel()
            gone.cancel()
        if audio not in done:
            if gone in done:
                self.finish("cancelled", cancel=True)
                raise ClientClosedRequest("the client closed the request before its first audio")
            self.finish("queue_timeout", cancel=True)
            raise QueueTimeout(f"no audio within the {timeout:g} s queue deadline")
        msg = audio.result()
        if isinstance(msg, StreamError):
            if msg.type == NothingToSay.type and self.silence_if_empty:
                return self.silence()  # the worker's stream is over: nothing to cancel
            self.finish(msg.type, cancel=True, code=msg.status)
            raise WorkerReportedError(msg)
        if isinstance(msg, StreamDone):
            empty = TTSError("the stream ended without audio")
            self.finish("empty_audio", code=empty.status)
            raise WorkerReportedError(StreamError.of(self.job.uid, empty))
        self.first_audio_s = time.perf_counter() - self.started
        self.engine_version = msg.engine_version
        metrics = self.state.metrics
        metrics.ttfa.observe(self.first_audio_s)
        metrics.queue_wait.observe(msg.queued_s)
        return msg

    def silence(self) -> AudioChunkMsg:
        """The silent exchange's one chunk: ``SILENCE_S`` of zeros at its rate (``rest`` then
        ends it, recorded ``empty_text`` with a 200)."""
        self.silent = True
        self.first_audio_s = time.perf_counter() - self.started
        pcm = bytes(2 * round(SILENCE_S * self.rate))
        return AudioChunkMsg(self.job.uid, pcm, 0, "", compute_s=0.0)

    def received(self, msg: AudioChunkMsg) -> None:
        """Account one chunk as it goes out: gap since the last one, and whether a client playing
        in real time from the first chunk would have run out of audio before it (an underrun)."""
        now = time.perf_counter()
        metrics = self.state.metrics
        if self._last_chunk is not None and not self.buffered:
            metrics.chunk_gap.observe(now - self._last_chunk)
            assert self.first_audio_s is not None
            if now - (self.started + self.first_audio_s) > self.audio_s:
                metrics.underruns.inc()
        self._last_chunk = now
        self.audio_s += len(msg.pcm) / 2 / self.rate

    async def rest(self) -> AsyncIterator[AudioChunkMsg]:
        """The chunks after the first; ends early, with ``failure`` set, if the worker fails
        mid-stream, the stream is aborted, or the worker sends nothing for the stream for the
        worker silence timeout (it would be killed by then if the whole worker were silent;
        this catches a stream lost inside a live worker)."""
        if self.silent:  # its one chunk was the first
            self.finish(NothingToSay.type, code=200)
            return
        assert self.box is not None
        timeout = self.state.settings.worker_silence_timeout_s
        while True:
            try:
                msg = await asyncio.wait_for(self.box.get(), timeout)
            except asyncio.TimeoutError:
                msg = StreamError.of(self.job.uid, WorkerStalled("the stream stalled"))
            if isinstance(msg, AudioChunkMsg):
                yield msg
                continue
            if isinstance(msg, StreamError):
                self.failure = self.failure or msg
                self.finish(msg.type, cancel=True)
                if not self.buffered:
                    self.caller.cut = True  # the transport must not end it as whole
            else:
                self.compute_s = msg.compute_s
                self.finish("ok")
            return

    async def encoded(
        self, first: AudioChunkMsg
    ) -> AsyncIterator[tuple[bytes, AudioChunkMsg | None]]:
        """The stream's audio in its order's format as it comes, for any transport to frame:
        each chunk's bytes with its message (its words, its offset), then what the encoder held
        back, with ``None``, unless the stream failed (``failure`` is then set: a stream that
        failed must not look finished). Encoding runs off the event loop where it costs."""
        assert self.encoder is not None
        yield await _encode(self.encoder, first.pcm), first
        async for msg in self.rest():
            self.received(msg)
            yield await _encode(self.encoder, msg.pcm), msg
        if self.failure is None:
            yield await _encode(self.encoder, None), None

    def abort(self, error: TTSError) -> None:
        """End the request now as a failure with ``error``: recorded at once, cancelled in its
        worker; whoever waits on its mailbox wakes to the error and ends the response."""
        if self._finished:
            return
        failure = StreamError.of(self.job.uid, error)
        if self.first_audio_s is not None:
            self.failure = failure
        self.finish(error.type, cancel=True, code=error.status)
        if self.box is not None:
            self.box.put_nowait(failure)

    def release_encoder(self) -> None:
        """Count the encoder's time and free it (off the loop) if the response did not end it."""
        encoder, self.encoder = self.encoder, None
        if encoder is None:
            return
        self.state.metrics.encode_seconds.labels(encoder.format.name).inc(encoder.seconds)
        if not encoder.closed:
            close_later(encoder)

    def finish(self, status: str, cancel: bool = False, code: int | None = None) -> None:
        """Release everything this request holds; only the first call counts.

        The recorded code is what the client experienced: 200 only for a stream that ended
        whole; a stream cut after its 200 status line counts as its failure's status (and in
        ``ttsvc_aborted_streams``), a client that left as 499.
        """
        if self._finished:
            return
        self._finished = True
        self.state.aborts.pop(self, None)
        if self.pool is not None and self.wid is not None:
            if cancel and not self.silent:  # a silent one's worker (if any) has ended it
                self.pool.cancel(self.wid, self.job.uid)
            self.pool.forget(self.job.uid)
        self.state.inflight -= 1
        if self.state.inflight == 0:
            self.state.idle.set()
        latency = time.perf_counter() - self.started
        metrics = self.state.metrics
        if status == "ok":
            metrics.latency.observe(latency)
            metrics.characters.inc(len(self.job.text))
            if self.compute_s is not None and self.audio_s > 0:
                metrics.rtf.observe(self.compute_s / self.audio_s)
        if status == "cancelled":
            metrics.cancellations.inc()
        if self.failure is not None and not self.buffered:
            metrics.aborted_streams.labels(status).inc()
        metrics.audio_seconds.inc(self.audio_s)
        if self.ticket is not None:  # a silence (nothing to speak) costs its key no audio
            self.state.limiter.settle(self.ticket, 0.0 if self.silent else self.audio_s)
        rtf = None
        if self.compute_s is not None and self.audio_s > 0:
            rtf = round(self.compute_s / self.audio_s, 4)
        fields: dict[str, object] = {
            "uid": self.job.uid,
            "voice": self.job.voice,
            "worker": self.wid,
            "qsize": self.qsize,
            "text_len": len(self.job.text),
            "ttfa_ms": None if self.first_audio_s is None else round(1000 * self.first_audio_s, 1),
            "latency": round(1000 * latency, 1),
            "audio_s": round(self.audio_s, 3),
            "rtf": rtf,
            "engine_version": self.engine_version,
            "status": status,
            **self.caller.log_labels(),
        }
        if status != "ok":
            fields["error_type"] = status
        if code is None and self.failure is not None:
            code = self.failure.status
        if code is None:
            code = 200 if status == "ok" else _STATUS_OF.get(status, 503)
        self.state.complete(fields, code)
        self.caller.recorded = True
        self.caller.request_id = self.job.uid  # an error answered after this carries it


async def _encode(encoder: Encoder, pcm: bytes | None) -> bytes:
    """Encode a chunk (``None``: finish) in a thread, unless it only passes bytes through."""
    call = encoder.finish if pcm is None else (lambda: encoder.encode(pcm))
    if encoder.light:
        return call()
    return await asyncio.to_thread(call)


_STATUS_OF = {QueueTimeout.type: QueueTimeout.status,
              ClientClosedRequest.type: ClientClosedRequest.status}  # fmt: skip
"""HTTP code recorded for exchanges that end without audio or a worker's error
(499: client closed request)."""


class WorkerReportedError(TTSError):
    """A worker's ``StreamError`` before any byte was sent, answered with its own status/type."""

    def __init__(self, msg: StreamError) -> None:
        super().__init__(msg.message, field=msg.field)
        self.status = msg.status
        self.type = msg.type


async def start_exchange(
    state: GatewayState,
    order: SpeechOrder,
    caller: Caller,
) -> tuple[SynthesisExchange, AudioChunkMsg]:
    """Admit ``order`` (``admission.admit``), dispatch it to its worker and wait for
    its first audio, which is already accounted (``received``); refusals raise their error.

    Every API's synthesis goes through here. The caller owns the exchange from then on: it must
    end in ``finish`` and ``release_encoder`` (its encoder is made for ``order.format``).
    """
    settings = state.settings
    caller.text_len = len(order.text)  # its record says it, whatever refuses it
    try:
        script, spoken = await compose(state, order)
    except NothingToSay:  # SSML of only markup
        if order.empty_text == "error":
            raise
        script, spoken = None, order.text
        admitted = admit(state, order, caller, nothing=True)
    else:
        admitted = admit(state, order, caller, plain=script is None and not order.ssml)
    pool, wid, qsize, rate = admitted.pool, admitted.wid, admitted.qsize, admitted.rate
    key = caller.key
    # ids are always ours: a client reusing an id must not reach another request's stream
    uid = uuid.uuid4().hex
    if caller.client_request_id:
        log.info("request_id", uid=uid, client_request_id=caller.client_request_id[:128])
    # the rate the encoder was made for, always: a worker still on another version of the voice
    # (a swap rolling out) resamples to it instead of sending audio at another rate
    job = SynthesisJob(uid, spoken, order.speed, order.noise_scale, order.noise_w,
                       order.sentence_silence, rate, settings.max_audio_s,
                       None if key is None else key.name, order.voice,
                       order.speaker, order.timestamps, script)  # fmt: skip
    exchange = SynthesisExchange(state, caller, pool, wid, job, qsize,
                                 silence_if_empty=order.empty_text == "silence")  # fmt: skip
    exchange.buffered = not order.stream
    exchange.ticket = admitted.ticket
    exchange.encoder = admitted.encoder
    exchange.rate = rate
    state.metrics.format_requests.labels(order.format.name, order.api).inc()
    if admitted.silent:
        first = exchange.silence()
    else:
        try:
            first = await exchange.first(settings.queue_timeout_s)
        except BaseException:
            exchange.release_encoder()
            raise
    if pool is not None and wid is not None and not exchange.silent:
        pool.observe(wid, first.compute_s * 1000.0)  # worker-side time: see balancer_sim
    exchange.received(first)
    return exchange, first
