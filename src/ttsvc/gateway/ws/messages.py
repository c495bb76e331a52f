"""The wire format of ``/synthesize/stream`` (``stream_ws``): the client's messages and their
parsing, and the parts of the server's messages that need no session (``error_message``,
``chunk_words``).

It exists so the protocol is read in one place, apart from the session that speaks it
(``stream_ws_session``) and the route that admits it (``stream_ws``).

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
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel, ValidationError

from ttsvc.errors import InvalidParameter, TTSError
from ttsvc.gateway.core.order import VoiceSettings
from ttsvc.protocol import AudioChunkMsg, WordTime


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
    if (wait := exc.headers().get("Retry-After")) is not None:  # HTTP's header, as a field
        message["retry_after"] = int(wait)
    if sentence is not None:
        message["sentence"] = sentence
    return message


def chunk_words(chunk: AudioChunkMsg, start_s: float, at: int) -> list[dict[str, Any]]:
    """The word timestamps a worker's chunk carries (none without them), moved from its
    sentence's own timeline and text to the session's: a word's ``start`` and ``end`` are
    seconds from its stream's first sample, so ``start_s`` (where the sentence's audio began in
    the session) is added, and its ``text_span`` indexes the sentence's text, so ``at`` (where
    the sentence began in the session's text) is added."""
    out: list[dict[str, Any]] = []
    for word in getattr(chunk, "words", ()):
        entry = dict(word.to_json() if isinstance(word, WordTime) else word)
        for edge in ("start", "end", "time"):
            if isinstance(entry.get(edge), (int, float)):
                entry[edge] = round(entry[edge] + start_s, 6)
        span = entry.get("text_span")
        if isinstance(span, (list, tuple)) and len(span) == 2:
            entry["text_span"] = [span[0] + at, span[1] + at]
        out.append(entry)
    return out
