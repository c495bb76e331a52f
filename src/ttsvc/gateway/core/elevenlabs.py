"""What ElevenLabs' API means, shared by its two transports here: the streaming-input WebSockets
(``ws.elevenlabs``) and the HTTP text-to-speech routes (``http.elevenlabs``).

Why in the core: both transports must read ``output_format`` and ``voice_settings`` the same
way and place the request text's characters in time the same way, and a transport may not import
another. No IO.

Alignment: ElevenLabs sends, with each piece of audio, the characters it covers and when each
is said. ttsvc's worker knows words (``WordTime``: start and end in the request's audio, and the
characters of the text they were read from), so a word's time is spread evenly over its
characters, and the characters before it (spaces, punctuation) take the gap since the word
before; what follows the last word closes the text at the end of its audio.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from ttsvc.audio.encode import FORMATS, OutputFormat
from ttsvc.audio.resample import SUPPORTED_RATES
from ttsvc.errors import InvalidParameter
from ttsvc.protocol import WordTime
from ttsvc.ranges import Speed

DEFAULT_OUTPUT_FORMAT = "mp3_44100_128"
"""ElevenLabs' default when a client names none."""
_WORDLIKE = re.compile(r"\w")


class ElevenLabsVoiceSettings(BaseModel):
    """ElevenLabs' ``voice_settings``: ``speed`` is applied (ttsvc's range, wider than
    ElevenLabs' 0.7-1.2); ``stability``, ``similarity_boost``, ``style``,
    ``use_speaker_boost`` and the rest have no counterpart in a Piper voice and are ignored."""

    model_config = ConfigDict(extra="ignore")

    speed: Speed | None = None


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


_FLAG = TypeAdapter(bool)


def query_flag(query: Mapping[str, str], name: str) -> bool:
    """A yes/no query parameter (``auto_mode``, ``enable_ssml_parsing``, ``sync_alignment``)
    read as the HTTP routes read theirs: FastAPI's ``bool``, which is pydantic's (``true`` /
    ``false``, ``1`` / ``0``, ``yes`` / ``no``, ``on`` / ``off``, any case), absent is false.
    The WebSockets read their query by hand, so without this ``True`` meant true on one
    transport and false on the other. Anything else is refused, naming the parameter."""
    value = query.get(name)
    if value is None:
        return False
    try:
        return _FLAG.validate_python(value)
    except ValidationError:
        raise InvalidParameter(f"{name} must be true or false, not {value[:32]!r}",
                               field=name) from None


Char = tuple[str, int, int]
"""One character: itself, its start and its end in ms on the audio's timeline."""


def _spread(text: str, start: int, end: int) -> list[Char]:
    """``text``'s characters over ``[start, end)`` ms, evenly, on whole ms."""
    n = len(text)
    edges = [start + round(i * (end - start) / n) for i in range(n + 1)] if n else []
    return [(c, edges[i], edges[i + 1]) for i, c in enumerate(text)]


@dataclass
class Alignment:
    """One request text's characters placed in time as its words arrive, and handed out with
    the audio they fall in.

    ``start_ms`` is where the text's audio begins on the timeline; ``edge`` the end of the last
    character placed (every later one starts at or after it, so times never go back). A chunk's
    words start in the worker's audio of that chunk, but a resampled chunk comes out a few ms
    shorter (the resampler holds them back to the next one), so characters wait in ``pending``
    until the audio they start in has been sent."""

    text: str
    start_ms: float
    after: str = " "
    """Placed after the text when it closes: one space between a WebSocket context's sentences,
    nothing for a whole HTTP request."""
    edge: int = 0
    covered: int = 0
    """Characters of ``text`` placed so far."""
    closed: bool = False
    """Its closing punctuation (and ``after``) are placed: nothing more of it will be."""
    pending: list[Char] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.edge = max(self.edge, round(self.start_ms))

    def words(self, words: Iterable[WordTime], until_ms: float) -> list[Char]:
        """Place the characters ``words`` (a chunk's) cover, with the ones before each; returns
        those that start before ``until_ms`` (where the audio sent so far ends)."""
        for word in words:
            a, b = word.text_span
            if word.mark or self.closed or b <= self.covered:
                continue  # a word read from the same written form as the one before ("$5")
            begin = max(self.edge, round(self.start_ms + 1000 * word.start))
            end = max(begin, round(self.start_ms + 1000 * word.end))
            self.pending += _spread(self.text[self.covered:max(a, self.covered)], self.edge, begin)
            self.pending += _spread(self.text[max(a, self.covered):b], begin, end)
            self.covered, self.edge = b, end
            if not _WORDLIKE.search(self.text[b:]):  # the last word: what closes the text
                self._close(end)
        ready = next((i for i, c in enumerate(self.pending) if c[1] > until_ms),
                     len(self.pending))  # fmt: skip
        out, self.pending = self.pending[:ready], self.pending[ready:]
        return out

    def rest(self, end_ms: float) -> list[Char]:
        """Everything not handed out yet: what is left of the text and ``after``, up to
        ``end_ms`` (the end of its audio)."""
        self._close(end_ms)
        out, self.pending = self.pending, []
        return out

    def _close(self, end_ms: float) -> None:
        if self.closed:
            return
        self.closed = True
        end = max(self.edge, round(end_ms))
        self.pending += _spread(self.text[self.covered:] + self.after, self.edge, end)
        self.covered, self.edge = len(self.text), end
