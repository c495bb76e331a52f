"""The HTTP answer of a synthesis: the worker's audio encoded and streamed, or gathered whole.

``synthesis_response`` is the one path of every HTTP API (``/synthesize``, ``/v1/audio/speech``,
``/synthesize/with-timestamps``, and Wyoming through a request it makes): it starts the exchange,
encodes each chunk of PCM into the requested format (off the event loop where that costs) and
frames it as the API sends audio; the response it returns finishes the exchange however it ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from ttsvc.audio.encode import Encoder
from ttsvc.gateway.exchange import SynthesisExchange, WorkerReportedError, start_exchange
from ttsvc.gateway.models import SpeechOrder
from ttsvc.gateway.sse import AudioBody
from ttsvc.gateway.state import GatewayState


async def _encode(encoder: Encoder, pcm: bytes | None) -> bytes:
    """Encode a chunk (``None``: finish) in a thread, unless it only passes bytes through."""
    call = encoder.finish if pcm is None else (lambda: encoder.encode(pcm))
    if encoder.light:
        return call()
    return await asyncio.to_thread(call)


class ExchangeStreamingResponse(StreamingResponse):
    """A streaming response that finishes its exchange however the response ends.

    Starlette may cancel a response whose client left before its body iterator ever ran, and then
    no ``finally`` inside the iterator runs; this wrapper's does.
    """

    def __init__(self, exchange: SynthesisExchange, content: AsyncIterator[bytes],
                 media_type: str, headers: dict[str, str]) -> None:  # fmt: skip
        super().__init__(content, media_type=media_type, headers=headers)
        self.exchange = exchange

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.exchange.finish("cancelled", cancel=True)  # no-op after a normal end
            self.exchange.release_encoder()


async def synthesis_response(
    state: GatewayState, order: SpeechOrder, request: Request, framing: AudioBody | None = None
) -> Response:
    """The one path of the HTTP APIs: admit, dispatch, then stream (or gather) the encoded
    audio, framed by ``framing`` (the audio as it is, OpenAI's speech events, or audio with word
    timestamps)."""
    body = framing or AudioBody()
    exchange, first = await start_exchange(state, order, request)
    encoder = exchange.encoder
    assert encoder is not None
    rate = exchange.rate
    headers = {
        "X-Request-Id": exchange.job.uid,
        "X-Engine-Version": str(first.engine_version),
        "X-Sample-Rate": str(rate),
        "X-Accel-Buffering": "no",
        "Cache-Control": "no-store",
    }
    media = body.media_type or order.format.media_type(rate)

    if not order.stream:
        try:
            await _encode(encoder, first.pcm)
            async for msg in exchange.rest():
                exchange.received(msg)
                await _encode(encoder, msg.pcm)
            if exchange.failure is None:
                data = await _encode(encoder, None)
        finally:
            exchange.finish("cancelled", cancel=True)  # no-op after a normal end
            exchange.release_encoder()
        if exchange.failure is not None:  # nothing was sent yet: answer with the error
            raise WorkerReportedError(exchange.failure)
        data = body.audio(data, None) + body.end(exchange.audio_s)
        return Response(data, media_type=media, headers=headers)

    async def body_iter() -> AsyncIterator[bytes]:
        if data := body.audio(await _encode(encoder, first.pcm), first):
            yield data
        async for msg in exchange.rest():
            exchange.received(msg)
            if data := body.audio(await _encode(encoder, msg.pcm), msg):
                yield data
        if exchange.failure is None:  # a stream that failed must not look finished: no tail
            if data := body.audio(await _encode(encoder, None), None) + body.end(exchange.audio_s):
                yield data
        elif data := body.failed(exchange.failure):
            yield data  # before the cut (StreamAbort): why the stream ends

    return ExchangeStreamingResponse(exchange, body_iter(), media, headers)
