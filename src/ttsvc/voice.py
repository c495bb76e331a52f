"""The voice configuration a Piper voice ships beside its ONNX graph.

Only the fields synthesis needs are modelled; the rest of the file is kept verbatim in the engine
directory (``voice.json``) so nothing the voice's authors wrote is lost.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

HOP_LENGTH = 256
"""Samples per latent frame of Piper's VITS voices (the product of the HiFi-GAN upsample rates)."""
VOICE_FILE = "voice.json"
"""The voice's Piper config, kept verbatim in every engine version directory."""


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
    num_speakers: int = 1
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
                "sample_rate": audio.get("sample_rate", 22050)
                if isinstance(audio, dict)
                else 22050,
                "espeak_voice": espeak.get("voice", "en-us")
                if isinstance(espeak, dict)
                else "en-us",
                "phoneme_id_map": data.get("phoneme_id_map", {}),
                "inference": data.get("inference", {}),
                "num_speakers": data.get("num_speakers", 1),
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
