"""The voice configuration a Piper voice ships beside its ONNX graph.

Only the fields synthesis needs are modelled; the rest of the file is kept verbatim in the engine
directory (``voice.json``) so nothing the voice's authors wrote is lost.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

HOP_LENGTH = 256
"""Samples per latent frame of Piper's VITS voices (the product of the HiFi-GAN upsample rates)."""
SAMPLE_RATE = 22050
"""Piper's rate where a voice config names none, and what a voice is taken to speak at before its
engines are known (every Piper medium voice speaks at it)."""
VOICE_FILE = "voice.json"
"""The voice's Piper config, kept verbatim in every engine version directory."""
NAME_MAX = 64
NAME_RE = re.compile(rf"(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9_.\-]{{0,{NAME_MAX - 1}}}")
"""A voice's name, which is its directory in the engines directory (and the rule lexicon and
SSML names follow too): a plain directory name, never a path, whatever a catalogue, a request
or an argument says. The Helm chart's ``voices.pull`` schema holds the same rule."""
NAME_RULE = (f"letters, digits, '.', '_' and '-', starting with a letter or digit, no '..', "
             f"at most {NAME_MAX} characters")  # fmt: skip


def name_problem(name: str, what: str = "voice") -> str | None:
    """``None`` for a good name; else why not, in one line (a hostile name shown escaped and
    cut short, so it can neither break the line nor flood it)."""
    if NAME_RE.fullmatch(name):
        return None
    shown = name if len(name) <= 80 else f"{name[:77]}..."
    return f"{shown!r} is not a {what} name: {NAME_RULE}"


class InferenceDefaults(BaseModel):
    """The voice authors' defaults for the sampling knobs."""

    model_config = ConfigDict(extra="ignore")

    noise_scale: float = 0.667
    """Scale of the noise added to the latent frames (variation between renditions)."""
    length_scale: float = 1.0
    """Duration multiplier: > 1 speaks slower."""
    noise_w: float = 0.8
    """Scale of the noise in the stochastic duration predictor (rhythm variation)."""


class VoiceConfig(BaseModel):
    """What the text front end and the synthesizer need from a Piper voice config."""

    model_config = ConfigDict(extra="ignore")

    sample_rate: int
    """Output rate of the vocoder in Hz."""
    espeak_voice: str
    """The espeak-ng voice the phonemes were produced with at training time (e.g. ``en-us``)."""
    phoneme_id_map: dict[str, list[int]]
    """Phoneme (one Unicode code point, or a special symbol) to input ids."""
    inference: InferenceDefaults = Field(default_factory=InferenceDefaults)
    hop_length: int = HOP_LENGTH
    """Samples per latent frame."""
    num_speakers: int = Field(1, ge=1)
    """Speakers the graph was trained with; more than one means it takes a speaker id (``sid``)."""
    speaker_id_map: dict[str, int] = Field(default_factory=dict)
    """Speaker names to ids of a multi-speaker voice (may be empty: ids only)."""
    name: str = ""
    """The voice's name in the engines directory, for messages; empty where the config was read
    without one."""

    @classmethod
    def from_piper(cls, data: dict[str, object], name: str = "") -> VoiceConfig:
        """Build from the JSON a Piper voice ships (``<voice>.onnx.json``)."""
        audio = data.get("audio", {})
        espeak = data.get("espeak", {})
        return cls.model_validate(
            {
                "sample_rate": audio.get("sample_rate", SAMPLE_RATE)
                if isinstance(audio, dict)
                else SAMPLE_RATE,
                "espeak_voice": espeak.get("voice", "en-us")
                if isinstance(espeak, dict)
                else "en-us",
                "phoneme_id_map": data.get("phoneme_id_map", {}),
                "inference": data.get("inference", {}),
                "num_speakers": data.get("num_speakers", 1),
                "speaker_id_map": data.get("speaker_id_map") or {},
                "name": name,
            }
        )

    @classmethod
    def load(cls, path: Path) -> VoiceConfig:
        """Read a Piper voice config file."""
        raw = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: not a JSON object")
        return cls.from_piper(raw)


def speaker_id(config: VoiceConfig, value: int | str | None) -> int:
    """The speaker id ``value`` names: a name from the voice's ``speaker_id_map``, an id (an
    int, or a string of digits that is not a name), or ``None`` for the voice's first speaker.

    Raises ``ValueError`` naming the known speakers otherwise, so a client that asked for a
    speaker the voice does not have learns which ones it does.
    """
    if value is None:
        return 0
    if isinstance(value, str) and value in config.speaker_id_map:
        return config.speaker_id_map[value]
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.isascii() and value.isdigit():
        number = int(value)
    if number is not None and 0 <= number < config.num_speakers:
        return number
    voice = f"voice {config.name!r}" if config.name else "this voice"
    if config.num_speakers == 1:
        raise ValueError(f"{voice} has a single speaker (id 0): no speaker {value!r}")
    names = sorted(config.speaker_id_map, key=lambda n: (config.speaker_id_map[n], n))
    shown = ", ".join(names[:10]) + (f" ... ({len(names)} names)" if len(names) > 10 else "")
    known = f"names {shown} or " if names else ""
    raise ValueError(f"{voice} has no speaker {value!r}: use {known}an id from 0 to "
                     f"{config.num_speakers - 1}")  # fmt: skip


def describe(data: dict[str, object]) -> dict[str, object]:
    """What ``GET /voices`` tells a client about a voice, from its Piper config: its language
    (the config's own ``language`` block where the voice has one, else the espeak-ng voice), its
    sample rate and quality, and its speakers by name (multi-speaker voices map names to ids).

    Why: a client choosing among voices needs these without downloading the config; fields the
    config lacks are ``None`` rather than guessed.
    """

    def block(key: str) -> dict[str, object]:
        value = data.get(key)
        return value if isinstance(value, dict) else {}

    audio, espeak, language = block("audio"), block("espeak"), block("language")
    speakers = block("speaker_id_map")
    count = data.get("num_speakers")
    return {
        "language": {
            "code": language.get("code"),
            "name": language.get("name_english"),
            "espeak_voice": espeak.get("voice"),
        },
        "sample_rate": audio.get("sample_rate"),
        "quality": audio.get("quality"),
        "num_speakers": count if isinstance(count, int) else max(1, len(speakers)),
        "speakers": sorted(speakers, key=lambda name: (speakers[name], name)),
    }
