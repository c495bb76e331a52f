"""ElevenLabs' HTTP text-to-speech routes, so clients of its REST API (Pipecat's
``ElevenLabsHttpTTSService``, ElevenLabs' SDKs) can be pointed at ttsvc by changing their base
URL.

``POST /v1/text-to-speech/{voice_id}`` answers the whole audio, ``.../stream`` streams it,
``.../stream/with-timestamps`` streams JSON lines of base64 audio with the characters of the
request text each covers (``alignment``: seconds from the start of the utterance), and
``.../with-timestamps`` is that as one JSON object. Each request is one ``SpeechOrder`` through
the HTTP path every API takes (``synthesis_response``): the same keys, quotas, limits, metrics,
completion line and cancellation. ``output_format``, ``voice_settings`` and the alignment are
read and placed as on ElevenLabs' WebSockets (``core.elevenlabs``).
"""

from __future__ import annotations

import base64
import json
import re

from fastapi import FastAPI, Request, params
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict

from ttsvc.errors import TimestampsUnavailable
from ttsvc.gateway.core.elevenlabs import Alignment, Char, ElevenLabsVoiceSettings, output_format
from ttsvc.gateway.core.order import EmptyText, SpeechOrder
from ttsvc.gateway.core.state import GatewayState
from ttsvc.gateway.http.caller import http_caller
from ttsvc.gateway.http.speech import synthesis_response
from ttsvc.gateway.http.sse import AudioBody
from ttsvc.protocol import AudioChunkMsg, StreamError
from ttsvc.ranges import SPEED

API = "elevenlabs"
PATHS = re.compile(r"/v1/text-to-speech/[^/]+(/stream)?(/with-timestamps)?")
"""The routes' paths: every request to one ends in one completion line (``http.errors``)."""


class TextToSpeechRequest(BaseModel):
    """Body of the routes: ``text`` is spoken and ``voice_settings.speed`` applied; the other
    fields ElevenLabs defines are accepted and ignored (a Piper voice has one model, no seed,
    no language switch, and no context across requests), and so is any field not named here."""

    model_config = ConfigDict(extra="ignore")

    text: str
    model_id: str | None = None
    voice_settings: ElevenLabsVoiceSettings | None = None
    language_code: str | None = None
    seed: int | None = None
    previous_text: str | None = None
    next_text: str | None = None
    apply_text_normalization: str | None = None
    empty_text: EmptyText = "silence"
    """Ours (ElevenLabs' schema takes extra fields): a ``text`` with nothing to speak is a short
    silence, or with ``"error"`` the 422 ``empty_text``."""


class AlignedBody(AudioBody):
    """ElevenLabs' timestamped audio: one JSON line per piece of audio, ``{"audio_base64",
    "alignment", "normalized_alignment"}``; ``alignment`` holds the characters of the request
    text whose time starts in audio sent so far (``None`` when none do), each with its start
    and end in seconds from the utterance's start. Both alignments are the same: ttsvc aligns
    the text as sent. A failed stream gets a last line ``{"error", "type"}`` before the cut."""

    media_type = "application/x-ndjson"

    def __init__(self, text: str, rate: int, timestamps: bool) -> None:
        self.align = Alignment(text, 0.0, after="") if timestamps else None
        self.rate = rate
        self.samples = 0
        self.chars: list[Char] = []
        """Characters placed and not sent yet (a piece with no audio carries none)."""
        self._tail = b""

    def _ms(self) -> float:
        return 1000 * self.samples / self.rate

    def _line(self, data: bytes, chars: list[Char]) -> bytes:
        alignment = None
        if chars:
            alignment = {
                "characters": [c for c, _, _ in chars],
                "character_start_times_seconds": [start / 1000 for _, start, _ in chars],
                "character_end_times_seconds": [end / 1000 for _, _, end in chars],
            }
        payload = {"audio_base64": base64.b64encode(data).decode("ascii"),
                   "alignment": alignment, "normalized_alignment": alignment}  # fmt: skip
        return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"

    def audio(self, data: bytes, chunk: AudioChunkMsg | None) -> bytes:
        if chunk is None:  # what a codec held back: it goes out with the end
            self._tail += data
            return b""
        self.samples += len(chunk.pcm) // 2
        if self.align is not None:
            self.chars += self.align.words(chunk.words, self._ms())
        if not data:
            return b""
        chars, self.chars = self.chars, []
        return self._line(data, chars)

    def end(self, audio_s: float) -> bytes:
        chars, self.chars = self.chars, []
        if self.align is not None:
            chars += self.align.rest(self._ms())
        tail, self._tail = self._tail, b""
        if not tail and not self.samples:
            return b""  # no audio came at all: no line (a client would play a line's audio)
        return self._line(tail, chars) if tail or chars else b""

    def failed(self, failure: StreamError) -> bytes:
        return json.dumps({"error": failure.message, "type": failure.type}).encode() + b"\n"


class WholeAlignedBody(AlignedBody):
    """``/with-timestamps``: the same audio and alignment gathered into one JSON object, sent
    once the audio is all made (``alignment`` ``None`` with nothing to say)."""

    media_type = "application/json"

    def __init__(self, text: str, rate: int, timestamps: bool) -> None:
        super().__init__(text, rate, timestamps)
        self.data = b""
        self.all_chars: list[Char] = []

    def _line(self, data: bytes, chars: list[Char]) -> bytes:
        self.data += data
        self.all_chars += chars
        return b""

    def end(self, audio_s: float) -> bytes:
        super().end(audio_s)
        return super()._line(self.data, self.all_chars).rstrip(b"\n")

    def failed(self, failure: StreamError) -> bytes:
        return b""  # nothing was sent: the cut alone says the response is not whole


def add_elevenlabs_routes(app: FastAPI, state: GatewayState,
                          xi_guarded: list[params.Depends]) -> None:  # fmt: skip
    """Register the four routes on ``app`` behind the key (as ``xi-api-key`` too)."""

    async def speak(request: Request, voice_id: str, body: TextToSpeechRequest,
                    fmt_name: str | None, ssml: bool, *, stream: bool,
                    aligned: type[AlignedBody] | None) -> Response:  # fmt: skip
        caller = http_caller(request)
        fmt, rate = output_format(fmt_name)  # before the voice (and any wait for it)
        caller.labels["format"] = fmt.name
        voice = await state.resolve_voice(voice_id, caller)
        timestamps = aligned is not None
        if timestamps:
            try:
                state.require_durations(voice)
            except TimestampsUnavailable:
                timestamps = False  # engines without durations: audio without alignment
        settings = body.voice_settings
        speed = settings.speed if settings is not None and settings.speed is not None else SPEED
        order = SpeechOrder(text=body.text, voice=voice, format=fmt, stream=stream, api=API,
                            speed=speed, sample_rate=rate, timestamps=timestamps,
                            empty_text=body.empty_text, ssml=ssml)  # fmt: skip
        framing = None if aligned is None else aligned(body.text, rate, timestamps)
        return await synthesis_response(state, order, request, framing)

    # ElevenLabs' query parameters: output_format and enable_ssml_parsing (the text is SSML,
    # inline tags allowed) are honoured; optimize_streaming_latency and enable_logging are
    # accepted and ignored
    @app.post("/v1/text-to-speech/{voice_id}", dependencies=xi_guarded)
    async def whole(request: Request, voice_id: str, body: TextToSpeechRequest,
                    output_format: str | None = None,
                    optimize_streaming_latency: str | None = None,
                    enable_ssml_parsing: bool = False) -> Response:  # fmt: skip
        return await speak(request, voice_id, body, output_format, enable_ssml_parsing,
                           stream=False, aligned=None)  # fmt: skip

    @app.post("/v1/text-to-speech/{voice_id}/stream", dependencies=xi_guarded)
    async def streamed(request: Request, voice_id: str, body: TextToSpeechRequest,
                       output_format: str | None = None,
                       optimize_streaming_latency: str | None = None,
                       enable_ssml_parsing: bool = False) -> Response:  # fmt: skip
        return await speak(request, voice_id, body, output_format, enable_ssml_parsing,
                           stream=True, aligned=None)  # fmt: skip

    @app.post("/v1/text-to-speech/{voice_id}/stream/with-timestamps", dependencies=xi_guarded)
    async def streamed_aligned(request: Request, voice_id: str, body: TextToSpeechRequest,
                               output_format: str | None = None,
                               optimize_streaming_latency: str | None = None,
                               enable_ssml_parsing: bool = False) -> Response:  # fmt: skip
        return await speak(request, voice_id, body, output_format, enable_ssml_parsing,
                           stream=True, aligned=AlignedBody)  # fmt: skip

    @app.post("/v1/text-to-speech/{voice_id}/with-timestamps", dependencies=xi_guarded)
    async def whole_aligned(request: Request, voice_id: str, body: TextToSpeechRequest,
                            output_format: str | None = None,
                            optimize_streaming_latency: str | None = None,
                            enable_ssml_parsing: bool = False) -> Response:  # fmt: skip
        return await speak(request, voice_id, body, output_format, enable_ssml_parsing,
                           stream=True, aligned=WholeAlignedBody)  # fmt: skip
