"""The HTTP answer of a synthesis: the worker's audio encoded and streamed, or gathered whole.

``synthesis_response`` is the one path of every HTTP API (``/synthesize``, ``/v1/audio/speech``,
``/synthesize/with-timestamps``): it starts the core's exchange for the request's ``Caller`` and
frames the encoded audio as the API sends it; the response it returns finishes the exchange
however it ends. A request with nothing to speak is answered the same way, with its exchange's
short silence, and says so in ``X-Empty-Text: true``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from ttsvc.gateway.core.exchange import SynthesisExchange, WorkerReportedError, start_exchange
from ttsvc.gateway.core.order import SpeechOrder
from ttsvc.gateway.core.state import GatewayState
from ttsvc.gateway.http.caller import http_caller
from ttsvc.gateway.http.sse import AudioBody

EMPTY_TEXT_HEADER = "X-Empty-Text"
"""Set (``true``) on the answer to a text with nothing to speak: its audio is a short silence."""


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
    exchange, first = await start_exchange(state, order, http_caller(request))
    rate = exchange.rate
    headers = {
        "X-Request-Id": exchange.job.uid,
        "X-Engine-Version": str(first.engine_version),
        "X-Sample-Rate": str(rate),
        "X-Accel-Buffering": "no",
        "Cache-Control": "no-store",
    }
    if exchange.silent:  # nothing to speak: its silence came from no engine
        del headers["X-Engine-Version"]
        headers[EMPTY_TEXT_HEADER] = "true"
    media = body.media_type or order.format.media_type(rate)

    if not order.stream:
        data = b""
        try:
            async for encoded, _ in exchange.encoded(first):
                data = encoded  # a whole file: its encoder returns it all at the end
        finally:
            exchange.finish("cancelled", cancel=True)  # no-op after a normal end
            exchange.release_encoder()
        if exchange.failure is not None:  # nothing was sent yet: answer with the error
            raise WorkerReportedError(exchange.failure)
        data = body.audio(data, None) + body.end(exchange.audio_s)
        return Response(data, media_type=media, headers=headers)

    async def body_iter() -> AsyncIterator[bytes]:
        async for encoded, msg in exchange.encoded(first):
            tail = b"" if msg is not None else body.end(exchange.audio_s)
            if data := body.audio(encoded, msg) + tail:
                yield data
        if exchange.failure is not None and (data := body.failed(exchange.failure)):
            yield data  # before the cut (StreamAbort): why the stream ends

    return ExchangeStreamingResponse(exchange, body_iter(), media, headers)

