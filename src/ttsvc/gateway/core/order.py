"""What a synthesis request asks for: the voice settings every API shares and the ``SpeechOrder``
they resolve to.

Every API (``/synthesize``, OpenAI's ``/v1/audio/speech``, the WebSocket, Wyoming) turns its own
request into one ``SpeechOrder``, the single input of the gateway's shared synthesis path; the
fields and ranges they share, and the rules for a format's rate and streaming, are declared here
once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from ttsvc.audio.encode import FORMATS, OutputFormat
from ttsvc.audio.resample import SUPPORTED_RATES
from ttsvc.errors import InvalidParameter
from ttsvc.ranges import SENTENCE_SILENCE, SPEED, Noise, Silence, Speed
from ttsvc.text.ssml import is_ssml
from ttsvc.voice import name_problem


def _lexicon_name(name: str) -> str:
    """A lexicon is named as a voice is (its file's stem): never a path."""
    problem = name_problem(name, "lexicon")
    if problem is not None:
        raise ValueError(problem)
    return name


EmptyText = Literal["silence", "error"]
"""What a request with nothing to speak (blank, only symbols or emoji, SSML of only markup) is
answered with: ``silence``, a short silence (``exchange.SILENCE_S``) in the format asked for,
marked as such; ``error``, the 422 ``empty_text``."""


def empty_text_mode(value: object) -> EmptyText:
    """``empty_text`` where a protocol's own schema cannot declare it (a WebSocket's query, a
    Wyoming event): unset is ``silence``; anything else but the two is a 422 naming it."""
    if value is None:
        return "silence"
    if value not in get_args(EmptyText):
        raise InvalidParameter('empty_text must be "silence" or "error"', field="empty_text")
    return value  # type: ignore[return-value]


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
    ssml: bool | None = None
    """The text is SSML (unset: when it starts with ``<speak``)."""
    lexicons: list[Annotated[str, AfterValidator(_lexicon_name)]] | None = Field(
        None, max_length=16)
    """Loaded lexicons to apply, by name (``GET /lexicons``; unset: those of the voice's
    language; ``[]``: none)."""
    empty_text: EmptyText = "silence"
    """Nothing to speak: a short silence (default) or the 422 ``empty_text``."""

    def reads_ssml(self, text: str) -> bool:
        """Whether ``text`` is read as SSML: as the request says, else if it starts like SSML.
        Asked for and not SSML: a 422 rather than markup read out."""
        if self.ssml is None:
            return is_ssml(text)
        if self.ssml and not is_ssml(text):
            raise InvalidParameter("ssml is true but the text does not start with <speak",
                                   field="text")  # fmt: skip
        return self.ssml


@dataclass(frozen=True, kw_only=True)
class SpeechOrder:
    """What any API asks for, validated and resolved: the one input of the request core.

    Built by keyword only, and from a ``VoiceSettings`` by ``from_settings``, so the voice knobs
    are copied from a request in one place."""

    text: str
    voice: str
    """The served voice (resolved from the request's name or alias)."""
    format: OutputFormat
    stream: bool
    api: str
    """Which API asked (``synthesize``, ``openai``, ``timestamps``, ``websocket``, ``wyoming``),
    for metrics."""
    speed: float = SPEED
    noise_scale: float | None = None
    noise_w: float | None = None
    sentence_silence: float = SENTENCE_SILENCE
    sample_rate: int | None = None
    """Output rate, ``None`` for the voice's own."""
    speaker: int | None = None
    """Its speaker id (resolved from a name), ``None`` for its first."""
    timestamps: bool = False
    """Ask the worker for word timestamps (``AudioChunkMsg.words``)."""
    ssml: bool = False
    """``text`` is an SSML document (``core/script.py`` reads it)."""
    lexicons: tuple[str, ...] | None = None
    """The loaded lexicons to apply, by name (``None``: those of the voice's language)."""
    empty_text: EmptyText = "silence"
    """Nothing to speak: answered with a short silence, or (``error``) refused with a 422."""

    @classmethod
    def from_settings(cls, settings: VoiceSettings, *, text: str, voice: str,
                      speaker: int | None, format: OutputFormat, stream: bool, api: str,
                      timestamps: bool = False) -> SpeechOrder:  # fmt: skip
        """The order a request's ``VoiceSettings`` make, its rate checked against ``format``
        (``voice`` and ``speaker`` already resolved from the settings' names)."""
        return cls(text=text, voice=voice, format=format, stream=stream, api=api,
                   speed=settings.speed, noise_scale=settings.noise_scale,
                   noise_w=settings.noise_w, sentence_silence=settings.sentence_silence,
                   sample_rate=output_rate(format, settings.sample_rate), speaker=speaker,
                   timestamps=timestamps, ssml=settings.reads_ssml(text),
                   lexicons=None if settings.lexicons is None else tuple(settings.lexicons),
                   empty_text=settings.empty_text)  # fmt: skip


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
