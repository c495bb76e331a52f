"""The wire format of ElevenLabs' streaming-input WebSockets as ttsvc speaks it
(``ws.elevenlabs``): the client's messages, the ``output_format`` names, and the character
alignment that audio messages carry.

Why apart from the session: the protocol is ElevenLabs', read from the two agent frameworks that
speak it (LiveKit's ``livekit-plugins-elevenlabs``, Pipecat's ``ElevenLabsTTSService``), and
this module holds what was learned from them in one place, with no IO.

Alignment: ElevenLabs sends, with each piece of audio, the characters it covers and each one's
start and duration in ms. ttsvc's worker knows words (``WordTime``: start and end in the
sentence's audio, and the characters of the sentence they were read from), so a word's time is
spread evenly over its characters, and the characters before it (spaces, punctuation) take the
gap since the word before; a sentence's closing punctuation and one space follow its last word,
so the words of two sentences never run together. The two clients read the times differently:
LiveKit (which asks with ``sync_alignment=true``) as ms from the context's first audio, Pipecat
as ms from where the previous message's characters ended (it advances its clock by the last
character's end). Both are served from one timeline: ``Alignment`` places characters on the
context's timeline, and ``AlignmentClock`` writes them as the client asked.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ttsvc.audio.encode import FORMATS, OutputFormat
from ttsvc.audio.resample import SUPPORTED_RATES
from ttsvc.errors import InvalidParameter, TTSError
from ttsvc.protocol import WordTime
from ttsvc.ranges import Speed

DEFAULT_OUTPUT_FORMAT = "mp3_44100_128"
"""ElevenLabs' default when a client names none."""
MAX_CONTEXT_ID = 256
"""Characters of a ``context_id``: it is echoed in every message and kept as a key."""
_WORDLIKE = re.compile(r"\w")


class ElevenLabsVoiceSettings(BaseModel):
    """A context's ``voice_settings``: ``speed`` is applied (ttsvc's range, wider than
    ElevenLabs' 0.7-1.2); ``stability``, ``similarity_boost``, ``style``,
    ``use_speaker_boost`` and the rest have no counterpart in a Piper voice and are ignored."""

    model_config = ConfigDict(extra="ignore")

    speed: Speed | None = None


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


def output_format(value: str | None) -> tuple[OutputFormat, int]:
    """ttsvc's format and rate for an ElevenLabs ``output_format``: ``pcm_<rate>`` (raw s16le),
    ``ulaw_8000`` (µ-law), ``mp3_<rate>_<kbps>`` (MP3 at that rate; ttsvc's own bit rate).
    Others (Opus, A-law, rates ttsvc has not) are refused, naming ``output_format``."""
    name = value or DEFAULT_OUTPUT_FORMAT
    parts = name.split("_")
    kind = parts[0]
    rate = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
    shape = {"pcm": 2, "ulaw": 2, "mp3": 3}.get(kind)
    fmt = {"pcm": FORMATS["pcm"], "ulaw": FORMATS["mulaw"], "mp3": FORMATS["mp3"]}.get(kind)
    if (fmt is not None and rate is not None and len(parts) == shape
            and rate in SUPPORTED_RATES and fmt.rate_error(rate) is None):  # fmt: skip
        return fmt, rate
    rates = ", ".join(str(r) for r in SUPPORTED_RATES)
    raise InvalidParameter(f"output_format {name[:64]!r} is not served here: pcm_<rate> "
                           f"and mp3_<rate>_<kbps> with a rate of {rates}, or ulaw_8000",
                           field="output_format")  # fmt: skip


def error_message(exc: TTSError, context_id: str | None) -> dict[str, object]:
    """An ``error`` message: ElevenLabs' ``error`` (the words) with ttsvc's error ``type`` and
    ``field`` beside it, and the context it concerns."""
    message: dict[str, object] = {"error": exc.message, "type": exc.type}
    if exc.field is not None:
        message["field"] = exc.field
    if context_id is not None:
        message["contextId"] = context_id
    return message


Char = tuple[str, int, int]
"""One character: itself, its start and its end in ms on the context's timeline."""


def _spread(text: str, start: int, end: int) -> list[Char]:
    """``text``'s characters over ``[start, end)`` ms, evenly, on whole ms."""
    n = len(text)
    edges = [start + round(i * (end - start) / n) for i in range(n + 1)] if n else []
    return [(c, edges[i], edges[i + 1]) for i, c in enumerate(text)]


@dataclass
class Alignment:
    """One sentence's characters placed in time as its words arrive, and handed out with the
    audio they fall in.

    ``start_ms`` is where the sentence's audio begins on the context's timeline; ``edge`` the end
    of the last character placed (every later one starts at or after it, so times never go
    back). A chunk's words start in the worker's audio of that chunk, but a resampled chunk
    comes out a few ms shorter (the resampler holds them back to the next one), so characters
    wait in ``pending`` until the audio they start in has been sent."""

    text: str
    start_ms: float
    edge: int = 0
    covered: int = 0
    """Characters of ``text`` placed so far."""
    closed: bool = False
    """Its closing punctuation and space are placed: nothing more of it will be."""
    pending: list[Char] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.edge = max(self.edge, round(self.start_ms))

    def words(self, words: Iterable[WordTime], until_ms: float) -> list[Char]:
        """Place the characters ``words`` (a chunk's) cover, with the ones before each; returns
        those that start before ``until_ms`` (where the audio sent so far ends)."""
        for word in words:
            a, b = word.text_span
            if self.closed or b <= self.covered:
                continue  # a word read from the same written form as the one before ("$5")
            begin = max(self.edge, round(self.start_ms + 1000 * word.start))
            end = max(begin, round(self.start_ms + 1000 * word.end))
            self.pending += _spread(self.text[self.covered:max(a, self.covered)], self.edge, begin)
            self.pending += _spread(self.text[max(a, self.covered):b], begin, end)
            self.covered, self.edge = b, end
            if not _WORDLIKE.search(self.text[b:]):  # the last word: what closes the sentence
                self._close(end)
        ready = next((i for i, c in enumerate(self.pending) if c[1] > until_ms),
                     len(self.pending))  # fmt: skip
        out, self.pending = self.pending[:ready], self.pending[ready:]
        return out

    def rest(self, end_ms: float) -> list[Char]:
        """Everything not handed out yet: what is left of the sentence and the space after it,
        up to ``end_ms`` (the end of its audio)."""
        self._close(end_ms)
        out, self.pending = self.pending, []
        return out

    def _close(self, end_ms: float) -> None:
        if self.closed:
            return
        self.closed = True
        end = max(self.edge, round(end_ms))
        self.pending += _spread(self.text[self.covered:] + " ", self.edge, end)
        self.covered, self.edge = len(self.text), end


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
