"""OpenAI's speech events (``stream_format: "sse"``): how a response's audio is framed.

A response body is framed by one ``AudioBody``: the plain one sends the encoded audio as it is
(``stream_format: "audio"``, and every ``/synthesize`` answer); ``SpeechEventBody`` wraps the
same bytes, piece by piece, in OpenAI's server-sent events. Both see every chunk message the
worker sent, so per-chunk data that travels with the audio can go into the event that carries
it (``SpeechEventBody.extra``) without reshaping the writer.

The events are OpenAI's, framed as OpenAI sends them: a bare ``data:`` line of JSON and a blank
line, no ``event:`` or ``id:`` fields (clients such as LiveKit's read only ``data: `` lines).

* ``{"type": "speech.audio.delta", "audio": <base64>}`` per piece of encoded audio. The decoded
  pieces, joined, are exactly the body ``stream_format: "audio"`` would have sent: a streamed
  format arrives as it is encoded, a whole-file one (flac, or ``stream: false``) in one delta.
* ``{"type": "speech.audio.done", "usage": {...}}`` last, only after all the audio.
* A stream that fails after its first event ends with ``{"type": "error", "error": {...}}`` (the
  /v1 error shape, so a client that reads events learns why) and is then cut like any failed
  stream (``StreamAbort``): it never ends with ``done``, and a client that reads only deltas sees
  an unfinished response, not a short complete one.

Pure functions of their input: no IO, no event loop.
"""

from __future__ import annotations

import base64
import json
import math

from ttsvc.gateway.http.openai import openai_error
from ttsvc.protocol import AudioChunkMsg, StreamError, timed_json

SSE_MEDIA_TYPE = "text/event-stream"


class AudioBody:
    """The audio itself: each piece of encoded audio goes out as it is, nothing is added."""

    media_type: str | None = None
    """The response's Content-Type, ``None`` for the output format's own."""

    def audio(self, data: bytes, chunk: AudioChunkMsg | None) -> bytes:
        """The bytes to send for ``data``, the encoded audio of ``chunk`` (``None``: the
        encoder's tail, or a whole file)."""
        return data

    def end(self, audio_s: float) -> bytes:
        """The bytes that close a complete response of ``audio_s`` seconds of audio."""
        return b""

    def failed(self, failure: StreamError) -> bytes:
        """The bytes sent before a failed stream is cut."""
        return b""


class SpeechEventBody(AudioBody):
    """OpenAI's speech events around the encoded audio.

    Usage counts what this service meters: ``input_tokens`` is the input's characters (what
    quotas and ``ttsvc_characters`` count), ``output_tokens`` the acoustic frames the voice
    generated (one per hop of samples at its own rate: the unit its model emits), and
    ``total_tokens`` their sum, as OpenAI defines it.
    """

    media_type = SSE_MEDIA_TYPE

    def __init__(self, input_chars: int, frames_per_s: float, words: bool = False) -> None:
        self.input_chars = input_chars
        self.frames_per_s = frames_per_s
        self.words = words
        """Deltas carry their chunk's offset and word timestamps (ours, asked for with
        ``timestamps``; OpenAI's clients ignore keys they do not know)."""

    def extra(self, chunk: AudioChunkMsg | None) -> dict[str, object]:
        """Keys added to the delta that carries ``chunk``'s audio: its offset and words when
        asked for."""
        if not self.words or chunk is None:
            return {}
        return {"offset_s": round(chunk.offset_s, 6), **timed_json(chunk.words)}

    def audio(self, data: bytes, chunk: AudioChunkMsg | None) -> bytes:
        if not data:  # a codec holding samples until it has a frame's worth: no event
            return b""
        audio = base64.b64encode(data).decode("ascii")
        return event({"type": "speech.audio.delta", "audio": audio, **self.extra(chunk)})

    def end(self, audio_s: float) -> bytes:
        return event({"type": "speech.audio.done", "usage": self.usage(audio_s)})

    def failed(self, failure: StreamError) -> bytes:
        body = {"error": failure.message, "type": failure.type}
        if failure.field is not None:
            body["field"] = failure.field
        return event({"type": "error", **openai_error(body)})

    def usage(self, audio_s: float) -> dict[str, int]:
        frames = math.ceil(round(audio_s * self.frames_per_s, 6))
        return {"input_tokens": self.input_chars, "output_tokens": frames,
                "total_tokens": self.input_chars + frames}  # fmt: skip


def event(payload: dict[str, object]) -> bytes:
    """One server-sent event: a ``data:`` line of compact JSON (never multi-line) and a blank
    line."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"
