"""OpenAI's speech API as ttsvc speaks it: names, limits, request body and error shape.

Pure data and functions; the routes live with the others in ``ttsvc.gateway.http.routes`` and share
their one synthesis path.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ttsvc.gateway.core.order import EmptyText
from ttsvc.ranges import SPEED, Speed

OPENAI_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "gpt-4o-mini-tts-2025-12-15")
"""Model names OpenAI clients send; all are served by the one engine set."""
OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage",
                 "shimmer", "verse", "marin", "cedar")  # fmt: skip
"""OpenAI's voice names: each maps to the configured voice unless ``voice_aliases`` says else."""
OPENAI_RATE = 24000
"""OpenAI's audio is 24 kHz (its ``pcm`` is defined so): every format of /v1 is at this rate."""
OPENAI_MAX_INPUT = 4096


class VoiceRef(BaseModel):
    """OpenAI's custom-voice form, ``{"id": ...}``."""

    model_config = ConfigDict(extra="forbid")

    id: str


class SpeechRequest(BaseModel):
    """Body of ``POST /v1/audio/speech`` (OpenAI's fields and limits; ``stream`` is ours)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    input: str = Field(max_length=OPENAI_MAX_INPUT)
    voice: str | VoiceRef
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: Speed = SPEED
    instructions: str | None = None
    """Style prompts of OpenAI's newer models; this voice has no style control: ignored."""
    stream_format: Literal["audio", "sse"] = "audio"
    """``audio``: the encoded audio as the body; ``sse``: the same audio as OpenAI's speech
    events (``ttsvc.gateway.http.sse``), for every model name (OpenAI offers them only for its newer
    models; here one engine serves them all)."""
    timestamps: bool = False
    """Ours: with ``stream_format: "sse"``, each delta also carries its ``offset_s`` and the
    words whose audio starts in it (``{word, start, end, text_span}``), as on
    ``/synthesize/with-timestamps``."""
    stream: bool | None = None
    """Ours: ``false`` sends one file with exact sizes; unset streams as OpenAI does, except
    flac, which is sent whole (its header must hold the sample count for readers)."""
    empty_text: EmptyText = "silence"
    """Ours (the OpenAI SDK sends it in ``extra_body``): an ``input`` with nothing to speak is
    a short silence, or with ``"error"`` the 422 ``empty_text``."""


def openai_error(body: dict[str, str]) -> dict[str, object]:
    """OpenAI's error shape for /v1 routes (its SDKs read ``error.message``); ``type`` and
    ``code`` keep ttsvc's error type, ``param`` the field."""
    field = body.get("field")
    param = _OPENAI_FIELDS.get(field, field) if field is not None else None
    return {"error": {"message": body["error"], "type": body["type"], "param": param,
                      "code": body["type"]}}  # fmt: skip


_OPENAI_FIELDS = {"text": "input", "format": "response_format"}
"""Fields the shared path names as /synthesize does, under their OpenAI names."""


def model_card(name: str) -> dict[str, object]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "ttsvc"}
