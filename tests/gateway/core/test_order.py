"""A ``SpeechOrder`` made from a request's voice settings: its rate and whether it streams.

Every API builds its order here; a rate or stream flag resolved wrongly reaches admission as an
order the format cannot encode (a 422 the client did not cause) or a whole file sent as a stream.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ttsvc.audio.encode import FORMATS
from ttsvc.errors import InvalidParameter
from ttsvc.gateway.core.caller import Caller
from ttsvc.gateway.core.keys import ApiKey
from ttsvc.gateway.core.order import SpeechOrder, VoiceSettings, output_rate, streamed
from ttsvc.gateway.core.quotas import Quota


def test_an_order_copies_the_voice_knobs_from_the_settings() -> None:
    settings = VoiceSettings(speed=1.5, noise_scale=0.3, noise_w=0.4, sentence_silence=0.5,
                             sample_rate=16000)  # fmt: skip
    speech = SpeechOrder.from_settings(settings, text="Hi.", voice="v", speaker=2,
                                       format=FORMATS["mp3"], stream=True, api="synthesize",
                                       timestamps=True)  # fmt: skip
    assert (speech.speed, speech.noise_scale, speech.noise_w) == (1.5, 0.3, 0.4)
    assert (speech.sentence_silence, speech.sample_rate) == (0.5, 16000)
    assert (speech.speaker, speech.timestamps, speech.voice) == (2, True, "v")


def test_opus_with_no_rate_asked_gets_its_default_rate() -> None:
    assert output_rate(FORMATS["opus"], None) == 24000
    assert output_rate(FORMATS["wav"], None) is None  # the voice's own


def test_a_rate_no_format_takes_is_refused_listing_the_rates() -> None:
    with pytest.raises(InvalidParameter) as refused:
        output_rate(FORMATS["wav"], 11025)
    assert refused.value.field == "sample_rate" and "22050" in refused.value.message


def test_a_supported_rate_the_format_refuses_is_refused_with_the_format_s_reason() -> None:
    with pytest.raises(InvalidParameter) as refused:
        output_rate(FORMATS["mulaw"], 16000)
    assert refused.value.field == "sample_rate" and "8 kHz" in refused.value.message


def test_a_whole_file_format_refuses_an_explicit_stream() -> None:
    assert streamed(FORMATS["flac"], None) is False
    assert streamed(FORMATS["flac"], False) is False
    with pytest.raises(InvalidParameter) as refused:
        streamed(FORMATS["flac"], True)
    assert refused.value.field == "stream" and "mp3" in refused.value.message


def test_a_streaming_format_streams_unless_told_not_to() -> None:
    assert (streamed(FORMATS["mp3"], None), streamed(FORMATS["mp3"], False)) == (True, False)


def test_a_caller_s_labels_add_to_the_key_and_may_set_the_format() -> None:
    assert Caller().log_labels() == {"key": None, "format": None}
    caller = Caller(key=ApiKey("bob", bytes(32), Quota()),
                    labels={"format": "opus", "stream_format": "sse"})  # fmt: skip
    assert caller.log_labels() == {"key": "bob", "format": "opus", "stream_format": "sse"}


@pytest.mark.parametrize("name", ["../brands", "a..b", ".hidden", "x" * 65])
def test_a_lexicon_name_is_never_a_path(name: str) -> None:
    """Lexicons are named as voices are (``ttsvc.voice.name_problem``): one rule everywhere."""
    with pytest.raises(ValidationError, match="is not a lexicon name"):
        VoiceSettings(lexicons=[name])
    assert VoiceSettings(lexicons=["brands", "en_US.v2-x"]).lexicons == ["brands", "en_US.v2-x"]
