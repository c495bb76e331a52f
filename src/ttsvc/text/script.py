"""Which letters a voice's language can speak, decided by their Unicode script.

Why this exists: espeak-ng reads a letter of a script its language has no rules for by naming it.
An English voice given "中" says "Chinese letter", Kana becomes "Japanese letter", Arabic
"Arabic meem ...", Greek and Cyrillic are spelled out letter by letter. That is confident
nonsense audio, so such text is refused up front with a 422 that names the voice's language and
the script found: the client can act on it (send the text to a voice of that language).

Policy:

* Any letter of a script the language does not use is refused, however few. Each one is spoken
  as its script's name, not skipped, so one Chinese word inside English still puts "Chinese
  letter" in the audio; dropping such letters would change what the text says without telling the
  client; and a share threshold would pass a word in a long text and refuse it in a short one.
* Only letters are judged. Digits, punctuation, symbols and emoji are the normalizer's business,
  and combining marks go with their letter. Accented letters (é, ø, ß) are Latin like any other.
  A letter of no particular script (Unicode's Common, e.g. mathematical bold letters) is not
  judged.
* Latin letters are accepted by every voice: acronyms, brand names and units appear in text of
  every language, and espeak-ng reads a Latin word inside any language with its English rules.
* A language missing from ``LANGUAGES`` is not checked: refusing text for a voice nothing is known
  about would be worse than the odd spelled-out letter.

Scripts come from Unicode's own Scripts.txt and ScriptExtensions.txt (fontTools' tables); a letter
shared by several scripts (the Kana length mark ー) is speakable when one of them is.
"""

from __future__ import annotations

from dataclasses import dataclass

from fontTools import unicodedata as ucd

from ttsvc.errors import UnsupportedScript
from ttsvc.voice import VoiceConfig

__all__ = ["LANGUAGES", "Language", "foreign_letter", "language_of", "require_script"]

_NO_SCRIPT = frozenset({"Zyyy", "Zinh", "Zzzz"})
"""ISO 15924 codes of Common, Inherited and Unknown: letters of no one language."""
_ALWAYS = frozenset({"Latn"})


@dataclass(frozen=True)
class Language:
    """What the error message calls the language, and the scripts (ISO 15924) it is written in."""

    name: str
    scripts: frozenset[str]


def _lang(name: str, *scripts: str) -> Language:
    return Language(name, frozenset(scripts) | _ALWAYS)


_LATIN_SCRIPT: dict[str, str] = {
    "af": "Afrikaans", "an": "Aragonese", "az": "Azerbaijani", "bs": "Bosnian",
    "ca": "Catalan", "cs": "Czech", "cy": "Welsh", "da": "Danish", "de": "German",
    "en": "English", "eo": "Esperanto", "es": "Spanish", "et": "Estonian",
    "eu": "Basque", "fi": "Finnish", "fr": "French", "ga": "Irish", "gd": "Gaelic",
    "hr": "Croatian", "ht": "Haitian Creole", "hu": "Hungarian", "id": "Indonesian",
    "is": "Icelandic", "it": "Italian", "la": "Latin", "lb": "Luxembourgish",
    "lt": "Lithuanian", "lv": "Latvian", "ms": "Malay", "mt": "Maltese",
    "nb": "Norwegian", "nl": "Dutch", "no": "Norwegian", "pl": "Polish",
    "pt": "Portuguese", "ro": "Romanian", "sk": "Slovak", "sl": "Slovenian",
    "sq": "Albanian", "sv": "Swedish", "sw": "Swahili", "tr": "Turkish",
    "vi": "Vietnamese",
}  # fmt: skip
"""Languages written in Latin letters only."""

LANGUAGES: dict[str, Language] = {
    **{code: _lang(name) for code, name in _LATIN_SCRIPT.items()},
    "be": _lang("Belarusian", "Cyrl"),
    "bg": _lang("Bulgarian", "Cyrl"),
    "kk": _lang("Kazakh", "Cyrl"),
    "ky": _lang("Kyrgyz", "Cyrl"),
    "mk": _lang("Macedonian", "Cyrl"),
    "ru": _lang("Russian", "Cyrl"),
    "sr": _lang("Serbian", "Cyrl"),
    "tt": _lang("Tatar", "Cyrl"),
    "uk": _lang("Ukrainian", "Cyrl"),
    "el": _lang("Greek", "Grek"),
    "grc": _lang("Ancient Greek", "Grek"),
    "hy": _lang("Armenian", "Armn"),
    "ka": _lang("Georgian", "Geor"),
    "he": _lang("Hebrew", "Hebr"),
    "ar": _lang("Arabic", "Arab"),
    "fa": _lang("Persian", "Arab"),
    "ur": _lang("Urdu", "Arab"),
    "hi": _lang("Hindi", "Deva"),
    "mr": _lang("Marathi", "Deva"),
    "ne": _lang("Nepali", "Deva"),
    "bn": _lang("Bengali", "Beng"),
    "gu": _lang("Gujarati", "Gujr"),
    "pa": _lang("Punjabi", "Guru"),
    "kn": _lang("Kannada", "Knda"),
    "ml": _lang("Malayalam", "Mlym"),
    "ta": _lang("Tamil", "Taml"),
    "te": _lang("Telugu", "Telu"),
    "si": _lang("Sinhala", "Sinh"),
    "th": _lang("Thai", "Thai"),
    "am": _lang("Amharic", "Ethi"),
    "cmn": _lang("Chinese (Mandarin)", "Hani", "Bopo"),
    "zh": _lang("Chinese", "Hani", "Bopo"),
    "yue": _lang("Chinese (Cantonese)", "Hani"),
    "hak": _lang("Chinese (Hakka)", "Hani"),
    "ja": _lang("Japanese", "Hani", "Hira", "Kana"),
    "ko": _lang("Korean", "Hang"),
}
"""espeak-ng language (the part of a voice's ``espeak.voice`` before any ``-``) to its name and
scripts."""


def language_of(espeak_voice: str) -> Language | None:
    """The language of an espeak-ng voice name (``en-us``, ``cmn``, ``en-gb-x-rp``), or ``None``
    when it is not in the table: the most specific listed prefix wins."""
    parts = espeak_voice.lower().replace("_", "-").split("-")
    for end in range(len(parts), 0, -1):
        if (found := LANGUAGES.get("-".join(parts[:end]))) is not None:
            return found
    return None


def foreign_letter(text: str, scripts: frozenset[str]) -> tuple[int, str, str] | None:
    """The first letter of ``text`` written in none of ``scripts``: its index, the letter and its
    script's English name; ``None`` when every letter fits."""
    for index, ch in enumerate(text):
        if ch.isascii() or not ch.isalpha():
            continue
        found = frozenset(ucd.script_extension(ch)) - _NO_SCRIPT
        if found and not found & scripts:
            return index, ch, str(ucd.script_name(min(found)))
    return None


def require_script(text: str, voice: VoiceConfig) -> None:
    """Raise :class:`UnsupportedScript` when ``text`` has a letter the voice's language cannot
    speak (see the module docstring for the policy)."""
    language = language_of(voice.espeak_voice)
    if language is None:
        return
    found = foreign_letter(text, language.scripts)
    if found is None:
        return
    index, letter, script = found
    who = f"voice {voice.name}" if voice.name else "the voice"
    raise UnsupportedScript(
        f"{who} speaks {language.name} ({voice.espeak_voice}); the text has {script} letters "
        f"(first {letter!r} at character {index}), which it cannot speak",
        field="text",
    )
