"""Text → sentences of phoneme ids: the one entry point the synthesizer uses.

Kept separate from the pure steps so each step stays testable on its own, and so a worker runs
this (blocking, espeak-bound) work in one call; the gateway never phonemizes.
"""

from __future__ import annotations

from dataclasses import dataclass

from ttsvc.errors import NothingToSay
from ttsvc.text.normalize import require_speakable_mapped
from ttsvc.text.phonemize import _ESPEAK, phoneme_ids, phonemize
from ttsvc.text.script import require_script
from ttsvc.text.segment import split_sentences
from ttsvc.text.words import SpokenWord, phonemize_alone, spoken_words, tokens
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
    words: tuple[SpokenWord, ...] = ()
    """The request text's words this sentence says, with their ids (only when asked for)."""


class TextFrontEnd:
    """Normalize, segment, phonemize and map to ids for one voice."""

    def __init__(self, voice: VoiceConfig, max_sentence_chars: int = 200) -> None:
        self.voice = voice
        self.max_sentence_chars = max_sentence_chars

    def sentences(self, text: str, words: bool = False) -> list[Sentence]:
        """All sentences of ``text``; raises ``NothingToSay`` when none has a phoneme to say and
        ``UnsupportedScript`` when it has letters the voice's language cannot speak.

        The script is judged on the text as sent: normalization writes English words for numbers
        and symbols, which must not count against a voice of another language. ``words`` also
        finds each sentence's ``words`` (word timestamps): one more espeak-ng call per sentence,
        so only when asked for."""
        require_script(text, self.voice)
        mapped = require_speakable_mapped(text, track=words)
        normalized = mapped.text
        out: list[Sentence] = []
        cursor = 0
        for piece in split_sentences(normalized, self.max_sentence_chars):
            sentences = phonemize(piece, self.voice.espeak_voice)
            said: list[tuple[SpokenWord, ...]] = [()] * len(sentences)
            if words:
                start = normalized.find(piece, cursor)  # pieces are stripped, in order
                cursor = start + len(piece)
                toks = tokens(piece, start, mapped)
                alone = phonemize_alone(
                    toks, lambda joined: _ESPEAK.sentences(joined, self.voice.espeak_voice)
                )
                found = spoken_words(sentences, toks, alone, self.voice.phoneme_id_map)
                said = [tuple(w) for w in found]
            for phonemes, spoken in zip(sentences, said, strict=True):
                ids = phoneme_ids(phonemes, self.voice.phoneme_id_map)
                if len(ids) > 3:  # more than BOS, pad, EOS: something to say
                    out.append(Sentence(piece, tuple(phonemes), tuple(ids), spoken))
        if not out:
            raise NothingToSay("text has nothing to speak after normalization", field="text")
        return out
