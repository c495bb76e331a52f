"""Text in a script the voice's language cannot speak is refused, not read out as letter names."""

from __future__ import annotations

import pytest

from ttsvc.errors import TTSError
from ttsvc.text.frontend import TextFrontEnd
from ttsvc.text.script import foreign_letter, language_of, require_script
from ttsvc.voice import VoiceConfig


@pytest.fixture
def english(voice_config: VoiceConfig) -> VoiceConfig:
    assert voice_config.espeak_voice == "en-us"
    return voice_config.model_copy(update={"name": "en_US-joe-medium"})


def _refusal(voice: VoiceConfig, text: str) -> TTSError:
    with pytest.raises(TTSError) as raised:
        TextFrontEnd(voice).sentences(text)
    return raised.value


@pytest.mark.parametrize(
    ("text", "script"),
    [
        ("你好，世界。", "Han"),
        ("Привет, мир.", "Cyrillic"),
        ("Γειά σου κόσμε.", "Greek"),
        ("مرحبا بالعالم", "Arabic"),
        ("カタカナ", "Katakana"),
        ("ひらがな", "Hiragana"),
        ("한국어", "Hangul"),
        ("नमस्ते", "Devanagari"),
    ],
)
def test_a_script_english_cannot_speak_is_a_422_naming_the_language(
    english: VoiceConfig, text: str, script: str
) -> None:
    error = _refusal(english, text)
    assert (error.status, error.type, error.field) == (422, "unsupported_script", "text")
    assert "voice en_US-joe-medium speaks English (en-us)" in error.message
    assert f"the text has {script} letters" in error.message
    assert error.to_body()["field"] == "text"


def test_one_foreign_word_in_english_is_refused_and_located(english: VoiceConfig) -> None:
    # espeak-ng would say "Chinese letter" for it: one word is enough (the module's policy)
    error = _refusal(english, "The word for tea is 茶, and it is short.")
    assert error.type == "unsupported_script"
    assert "Han letters (first '茶' at character 20)" in error.message


def test_accents_emoji_symbols_and_digits_are_spoken_by_english(english: VoiceConfig) -> None:
    text = "Café naïve Øresund: Dvořák's Straße, señor! 🎉 It costs $5 ✓ at 3 p.m. 𝐛old ×2 ¾"
    assert foreign_letter(text, language_of("en-us").scripts) is None  # type: ignore[union-attr]
    sentences = TextFrontEnd(english).sentences(text)
    assert sentences and all(len(s.ids) > 3 for s in sentences)


@pytest.mark.parametrize(
    ("espeak_voice", "name"),
    [("en-us", "English"), ("en-gb-x-rp", "English"), ("EN_us", "English"),
     ("cmn", "Chinese (Mandarin)"), ("ja", "Japanese"), ("ru", "Russian"), ("pt-br", "Portuguese"),
     ("fa", "Persian")],
)  # fmt: skip
def test_language_of_an_espeak_voice(espeak_voice: str, name: str) -> None:
    found = language_of(espeak_voice)
    assert found is not None and found.name == name


@pytest.mark.parametrize(
    ("espeak_voice", "speakable", "foreign"),
    [
        ("ru", "Привет, iPhone 15!", "Привет, 中国"),
        ("uk", "Привіт, світе ґ", "Γειά"),
        ("cmn", "你好, OK 5G", "こんにちは"),
        ("ja", "こんにちは、カタカナ、漢字、ラーメン", "안녕"),
        ("ko", "안녕하세요 K-pop", "你好"),
        ("el", "Γειά σου Bob", "Привет"),
        ("ar", "مرحبا SMS", "שלום"),
        ("hi", "नमस्ते", "مرحبا"),
        ("de", "Grüße aus Köln", "Привет"),
    ],
)
def test_each_language_speaks_its_own_scripts_and_latin(
    voice_config: VoiceConfig, espeak_voice: str, speakable: str, foreign: str
) -> None:
    voice = voice_config.model_copy(update={"espeak_voice": espeak_voice})
    require_script(speakable, voice)
    with pytest.raises(TTSError, match=f"\\({espeak_voice}\\); the text has"):
        require_script(foreign, voice)


def test_a_language_not_in_the_table_is_not_checked(voice_config: VoiceConfig) -> None:
    require_script("你好 Привет", voice_config.model_copy(update={"espeak_voice": "xx-yy"}))


def test_the_kana_length_mark_belongs_to_japanese(voice_config: VoiceConfig) -> None:
    # "ー" is of Unicode's Common script with Hiragana and Katakana as its extensions
    assert foreign_letter("ー", frozenset({"Latn"})) == (0, "ー", "Hiragana")
    require_script("ー", voice_config.model_copy(update={"espeak_voice": "ja"}))


def test_without_a_name_the_message_says_the_voice(voice_config: VoiceConfig) -> None:
    with pytest.raises(TTSError, match=r"^the voice speaks English \(en-us\); the text has Han"):
        require_script("中", voice_config.model_copy(update={"name": ""}))
