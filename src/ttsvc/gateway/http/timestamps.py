"""``POST /synthesize/with-timestamps``: audio and word timestamps in one stream.

Why this shape: captioning, karaoke-style highlighting and voice agents that get interrupted
need to know which word is playing, in the same stream as the audio so nothing has to be matched
up afterwards. Each line (JSON lines, or one SSE ``data:`` event each) carries a chunk of audio
as base64, where it starts in the utterance (``offset_s``) and the words whose audio starts in
it (``{word, start, end, text_span}``, seconds from the stream's start); the last line says the
stream is complete. Like ElevenLabs' ``/stream/with-timestamps`` (JSON chunks of base64 audio
plus alignment) and Kokoro-FastAPI's captioned speech (base64 audio plus word timestamps per
chunk), but timed by word, not by character: the engine knows each phoneme's frames exactly and
which words they say, while character times would be made up by spreading a word over its
letters. ``text_span`` points into the request text, so words normalization made of one written
form ("$12.50" -> "twelve dollars and fifty cents") say so by sharing its span.

It is ``/synthesize`` in everything else: the same body (plus ``stream_format``), keys, quotas,
admission, metrics and completion log line, through the gateway's one synthesis path.
"""

from __future__ import annotations

import base64
import json
from typing import Literal

from fastapi import FastAPI, Request
from fastapi.params import Depends
from fastapi.responses import Response

from ttsvc.audio.encode import FORMATS
from ttsvc.errors import InvalidParameter
from ttsvc.gateway.core.order import SpeechOrder
from ttsvc.gateway.core.state import GatewayState
from ttsvc.gateway.http.bodies import SynthesizeRequest
from ttsvc.gateway.http.caller import http_caller
from ttsvc.gateway.http.speech import synthesis_response
from ttsvc.gateway.http.sse import AudioBody, event
from ttsvc.protocol import AudioChunkMsg, timed_json

PATH = "/synthesize/with-timestamps"
MEDIA_TYPES = {"jsonl": "application/x-ndjson", "sse": "text/event-stream"}


class TimestampedRequest(SynthesizeRequest):
    """Body of ``POST /synthesize/with-timestamps``: ``/synthesize``'s, streamed always."""

    format: Literal["wav", "pcm", "mulaw", "mp3", "opus", "flac"] = "pcm"
    """Raw PCM16 by default: each line's audio then decodes on its own."""
    stream_format: Literal["jsonl", "sse"] = "jsonl"
    """JSON lines (``application/x-ndjson``) or server-sent events (``text/event-stream``)."""


def chunk_json(msg: AudioChunkMsg, audio: bytes) -> dict[str, object]:
    """One chunk as clients receive it: its encoded ``audio`` and the words starting in it."""
    return {"audio": base64.b64encode(audio).decode("ascii"), "offset_s": round(msg.offset_s, 6),
            **timed_json(msg.words)}  # fmt: skip


class CaptionBody(AudioBody):
    """Each chunk's encoded audio with its offset and words, one JSON line (or SSE event) each;
    a last line says the stream is complete. A failed stream is cut with no last line."""

    def __init__(self, stream_format: str) -> None:
        self.sse = stream_format == "sse"
        self.media_type = MEDIA_TYPES[stream_format]
        self._tail = b""

    def _frame(self, payload: dict[str, object]) -> bytes:
        if self.sse:
            return event(payload)
        return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"

    def audio(self, data: bytes, chunk: AudioChunkMsg | None) -> bytes:
        if chunk is None:  # what a codec held back: it goes out with the end, at its offset
            self._tail += data
            return b""
        return self._frame(chunk_json(chunk, data))  # even with no bytes yet: its words

    def end(self, audio_s: float) -> bytes:
        tail = b""
        if self._tail:
            tail = self._frame({"audio": base64.b64encode(self._tail).decode("ascii"),
                                "offset_s": round(audio_s, 6), "words": []})  # fmt: skip
        return tail + self._frame({"done": True, "audio_s": round(audio_s, 6)})


def add_timestamps_route(
    app: FastAPI, state: GatewayState, guarded: list[Depends]
) -> None:
    """Register the route on ``app``."""

    @app.post(PATH, dependencies=guarded)
    async def with_timestamps(body: TimestampedRequest, request: Request) -> Response:
        http_caller(request).labels["format"] = body.format
        fmt = FORMATS[body.format]
        if body.stream is False or not fmt.streams:
            raise InvalidParameter(
                f"audio with timestamps is streamed: {body.format} with stream "
                f"{body.stream} is not (use pcm, wav, mp3, opus or mulaw)",
                field="format" if not fmt.streams else "stream",
            )
        voice = await state.resolve_voice(body.voice, http_caller(request))  # after the checks
        state.require_durations(voice)
        order = SpeechOrder.from_settings(body, text=body.text, voice=voice,
                                          speaker=await state.speaker_of(voice, body.speaker),
                                          format=fmt,
                                          stream=True, api="timestamps", timestamps=True)
        return await synthesis_response(state, order, request, CaptionBody(body.stream_format))
