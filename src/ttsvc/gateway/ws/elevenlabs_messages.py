"""The wire format of ElevenLabs' streaming-input WebSockets as ttsvc speaks it
(``ws.elevenlabs``): the client's messages, errors, and the clock the alignment is written on.

Why apart from the session: the protocol is ElevenLabs', read from the two agent frameworks that
speak it (LiveKit's ``livekit-plugins-elevenlabs``, Pipecat's ``ElevenLabsTTSService``), and
this module holds what was learned from them in one place, with no IO. What the HTTP routes share
with it (``output_format``, ``voice_settings``, placing characters in time: ``Alignment``) is in
``core.elevenlabs``.

Each sentence's closing punctuation and one space follow its last word, so the words of two
sentences never run together. The two clients read the times differently: LiveKit (which asks
with ``sync_alignment=true``) as ms from the context's first audio, Pipecat as ms from where the
previous message's characters ended (it advances its clock by the last character's end). Both
are served from one timeline: ``Alignment`` places characters on the context's timeline, and
``AlignmentClock`` writes them as the client asked.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ttsvc.errors import InvalidParameter, TTSError
from ttsvc.gateway.core.elevenlabs import Char, ElevenLabsVoiceSettings

MAX_CONTEXT_ID = 256
"""Characters of a ``context_id``: it is echoed in every message and kept as a key."""


class ClientMessage(BaseModel):
    """One client message. Fields ElevenLabs defines and ttsvc ignores (``generation_config``,
    ``try_trigger_generation``, ``pronunciation_dictionary_locators``, ``xi_api_key``...) are
    accepted and dropped."""

    model_config = ConfigDict(extra="ignore")

    text: str | None = None
    context_id: str | None = Field(default=None, max_length=MAX_CONTEXT_ID)
    voice_settings: ElevenLabsVoiceSettings | None = None
    flush: bool = False
    close_context: bool = False
    close_socket: bool = False


def parse_message(raw: str) -> ClientMessage:
    """A client message, or ``InvalidParameter`` naming the field at fault."""
    try:
        return ClientMessage.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        if first.get("type") in ("json_invalid", "model_type"):
            raise InvalidParameter("the message is not a JSON object", field="message") from None
        name = ".".join(str(p) for p in first.get("loc", ())) or "message"
        raise InvalidParameter(f"{name}: {first.get('msg', 'invalid')}", field=name) from None


def error_message(exc: TTSError, context_id: str | None) -> dict[str, object]:
    """An ``error`` message: ElevenLabs' ``error`` (the words) with ttsvc's error ``type`` and
    ``field`` beside it, and the context it concerns."""
    message: dict[str, object] = {"error": exc.message, "type": exc.type}
    if exc.field is not None:
        message["field"] = exc.field
    if (wait := exc.headers().get("Retry-After")) is not None:  # HTTP's header, as a field
        message["retry_after"] = int(wait)
    if context_id is not None:
        message["contextId"] = context_id
    return message


@dataclass
class AlignmentClock:
    """Writes a context's characters as its client reads them: ms from the context's first
    audio (``per_context``, LiveKit's reading), or from where the previous message's characters
    ended (Pipecat's, which adds each message's last end to its clock)."""

    per_context: bool
    at: int = 0
    """Where the client's clock stands (the last character's end sent)."""

    def message(self, chars: list[Char]) -> dict[str, object] | None:
        """The ``alignment`` of one audio message (``None`` for no characters)."""
        if not chars:
            return None
        base = 0 if self.per_context else self.at
        self.at = chars[-1][2]
        return {"chars": [c for c, _, _ in chars],
                "charStartTimesMs": [start - base for _, start, _ in chars],
                "charDurationsMs": [end - start for _, start, end in chars]}  # fmt: skip
