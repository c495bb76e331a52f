"""What a synthesis request asks for: the request bodies, and the ``SpeechOrder`` they resolve to.

Every API (``/synthesize``, OpenAI's ``/v1/audio/speech``, the WebSocket, Wyoming) turns its own
request into one ``SpeechOrder``, the single input of the gateway's shared synthesis path; the
fields and ranges they share, and the rules for a format's rate and streaming, are declared here
once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

from ttsvc.audio.encode import FORMATS, OutputFormat
from ttsvc.audio.resample import SUPPORTED_RATES
from ttsvc.errors import InvalidParameter
from ttsvc.ranges import SENTENCE_SILENCE, SPEED, Noise, Silence, Speed


class VoiceSettings(BaseModel):
    """How to speak, apart from the text: the fields every ttsvc API takes (``/synthesize``
    and its timestamped form, the WebSocket's ``start``), declared once with their ranges."""

    model_config = ConfigDict(extra="forbid")

    voice: str | None = None
    speaker: int | str | None = None
    """A multi-speaker voice's speaker, by name or id (``None``: its first)."""
    speed: Speed = SPEED
    noise_scale: Noise | None = None
    noise_w: Noise | None = None
    sentence_silence: Silence = SENTENCE_SILENCE
    sample_rate: int | None = None


class SynthesizeRequest(VoiceSettings):
    """Body of ``POST /synthesize``."""

    text: str
    format: Literal["wav", "pcm", "mulaw", "mp3", "opus", "flac"] = "wav"
    stream: bool | None = None
    """Unset: streamed, except formats sent only whole (flac)."""


@dataclass(frozen=True)
class SpeechOrder:
    """What either API asks for, validated and resolved: the one input of the shared path."""

    text: str
    speed: float
    noise_scale: float | None
    noise_w: float | None
    sentence_silence: float
    sample_rate: int | None
    """Output rate, ``None`` for the voice's own."""
    format: OutputFormat
    stream: bool
    api: str
    """``synthesize`` or ``openai``, for metrics."""
    voice: str = ""
    """The served voice (resolved from the request's name or alias)."""
    speaker: int | None = None
    """Its speaker id (resolved from a name), ``None`` for its first."""
    timestamps: bool = False
    """Ask the worker for word timestamps (``AudioChunkMsg.words``)."""


SpeakerLookup = Callable[[str, "int | str | None"], Awaitable["int | None"]]
"""A voice's speaker id for a request's ``speaker`` (a 422 naming the speakers if none)."""


def output_rate(fmt: OutputFormat, requested: int | None) -> int | None:
    """The output rate for ``fmt``: the requested one if the format takes it, else its default."""
    if requested is None:
        return fmt.default_rate
    if requested not in SUPPORTED_RATES:
        rates = ", ".join(str(r) for r in SUPPORTED_RATES)
        raise InvalidParameter(
            f"sample_rate {requested}: supported rates are {rates}", field="sample_rate"
        )
    if (why := fmt.rate_error(requested)) is not None:
        raise InvalidParameter(why, field="sample_rate")
    return requested


def streamed(fmt: OutputFormat, requested: bool | None) -> bool:
    """Whether the response streams: as asked, else as the format allows. A whole-file format
    refuses an explicit ``stream: true`` rather than ignore it: the client asked for audio as it
    is made, and is told which formats give it."""
    if requested is None:
        return fmt.streams
    if requested and not fmt.streams:
        playable = ", ".join(name for name, f in FORMATS.items() if f.streams)
        raise InvalidParameter(
            f"{fmt.name} is sent only as a whole file (its header holds the sample count); "
            f"formats that stream: {playable}",
            field="stream",
        )
    return requested
