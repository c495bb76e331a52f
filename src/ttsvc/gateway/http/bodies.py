"""The HTTP synthesis routes' own request bodies (the voice settings they share are the core's)."""

from __future__ import annotations

from typing import Literal

from ttsvc.gateway.core.order import VoiceSettings


class SynthesizeRequest(VoiceSettings):
    """Body of ``POST /synthesize``."""

    text: str
    format: Literal["wav", "pcm", "mulaw", "mp3", "opus", "flac"] = "wav"
    stream: bool | None = None
    """Unset: streamed, except formats sent only whole (flac)."""
