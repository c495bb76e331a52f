"""The front end on texts that crashed espeak-ng: normalization keeps every one of them away."""

from __future__ import annotations

import pytest

from ttsvc.text.frontend import TextFrontEnd
from ttsvc.text.phonemize import _ESPEAK
from ttsvc.text.poison import NEIGHBOURS, POISON
from ttsvc.voice import VoiceConfig

LANGUAGE = {"cyrillic.x60": "ru", "cjk.x40": "cmn"}
"""Poison in a script English does not speak, sent to a voice of a language that does: to an
English voice it is refused before espeak-ng (``ttsvc.text.script``)."""


@pytest.mark.parametrize("max_sentence_chars", [200, 2000])
@pytest.mark.parametrize("name", [*POISON, *NEIGHBOURS])
def test_poison_never_reaches_espeak_in_a_crashing_shape(
    name: str, max_sentence_chars: int, voice_config: VoiceConfig
) -> None:
    text = {**POISON, **NEIGHBOURS}[name]
    _ESPEAK.sentences("warm", "en-us")
    child = _ESPEAK.pid
    # raises UnspeakableText if espeak-ng crashed on what normalization let through
    voice = voice_config.model_copy(update={"espeak_voice": LANGUAGE.get(name, "en-us")})
    sentences = TextFrontEnd(voice, max_sentence_chars).sentences(text)
    assert sentences and all(len(s.ids) > 3 for s in sentences)
    assert _ESPEAK.pid == child  # the same espeak-ng process answered: it never crashed
