"""Text → sentences of phoneme ids: the one entry point the synthesizer uses.

Kept separate from the pure steps so each step stays testable on its own, and so the gateway
can run this (blocking, espeak-bound) work off its event loop in one call.
"""

from __future__ import annotations

from dataclasses import dataclass

from ttsvc.errors import NothingToSay
from ttsvc.text.normalize import require_speakable
from ttsvc.text.phonemize import phoneme_ids, phonemize
from ttsvc.text.script import require_script
from ttsvc.text.segment import split_sentences
from ttsvc.voice import VoiceConfig


@dataclass(frozen=True)
class Sentence:
    """One unit of synthesis: the acoustic engine runs once per sentence."""

    text: str
    """The normalized text espeak-ng read."""
    phonemes: tuple[str, ...]
    """espeak-ng IPA, one code point each."""
    ids: tuple[int, ...]
    """Voice input ids with BOS, EOS and padding."""


class TextFrontEnd:
    """Normalize, segment, phonemize and map to ids for one voice."""

    def __init__(self, voice: VoiceConfig, max_sentence_chars: int = 200) -> None:
        self.voice = voice
        self.max_sentence_chars = max_sentence_chars

    def sentences(self, text: str) -> list[Sentence]:
        """All sentences of ``text``; raises ``NothingToSay`` when none has a phoneme to say and
        ``UnsupportedScript`` when it has letters the voice's language cannot speak.

        The script is judged on the text as sent: normalization writes English words for numbers
        and symbols, which must not count against a voice of another language."""
        require_script(text, self.voice)
        normalized = require_speakable(text)
        out: list[Sentence] = []
        for piece in split_sentences(normalized, self.max_sentence_chars):
            for phonemes in phonemize(piece, self.voice.espeak_voice):
                ids = phoneme_ids(phonemes, self.voice.phoneme_id_map)
                if len(ids) > 3:  # more than BOS, pad, EOS: something to say
                    out.append(Sentence(piece, tuple(phonemes), tuple(ids)))
        if not out:
            raise NothingToSay("text has nothing to speak after normalization", field="text")
        return out
