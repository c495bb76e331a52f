"""ElevenLabs' query parameters as both transports read them (``gateway.core.elevenlabs``)."""

from __future__ import annotations

import pytest

from ttsvc.errors import InvalidParameter
from ttsvc.gateway.core.elevenlabs import output_format, query_flag


@pytest.mark.parametrize(
    ("value", "expected"),
    [("true", True), ("True", True), ("1", True), ("yes", True), ("on", True),
     ("false", False), ("FALSE", False), ("0", False), ("no", False), ("off", False)],
)  # fmt: skip
def test_a_flag_reads_as_fastapi_reads_a_bool(value: str, expected: bool) -> None:
    """The WebSockets' hand-read query agrees with the HTTP routes' ``bool`` parameters."""
    assert query_flag({"auto_mode": value}, "auto_mode") is expected


def test_an_absent_flag_is_false_and_a_bad_one_is_refused_by_name() -> None:
    assert query_flag({}, "enable_ssml_parsing") is False
    with pytest.raises(InvalidParameter) as bad:
        query_flag({"enable_ssml_parsing": "maybe"}, "enable_ssml_parsing")
    assert bad.value.field == "enable_ssml_parsing" and "maybe" in bad.value.message


def test_output_formats_name_their_rate_and_others_are_refused_by_name() -> None:
    assert output_format("pcm_16000")[1] == 16000
    assert output_format("ulaw_8000")[0].name == "mulaw"
    assert output_format("mp3_22050_32") == (output_format("mp3_22050_128")[0], 22050)
    for bad in ("pcm", "pcm_32000", "opus_48000_64", "mp3_44100", "alaw_8000"):
        with pytest.raises(InvalidParameter) as refused:
            output_format(bad)
        assert refused.value.field == "output_format"
