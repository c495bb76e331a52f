"""Text → sentences of phoneme ids: the one entry point the synthesizer uses.

Kept separate from the pure steps so each step stays testable on its own, and so a worker runs
this (blocking, espeak-bound) work in one call; the gateway never phonemizes.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ttsvc.errors import NothingToSay
from ttsvc.protocol import ScriptRun, ScriptText
from ttsvc.text.normalize import require_speakable_mapped
from ttsvc.text.phonemize import _ESPEAK, BOS, PAD, phoneme_ids, phonemize
from ttsvc.text.script import require_script
from ttsvc.text.segment import split_sentences
from ttsvc.text.tracked import Normalized, Span
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
        out = self._sentences(require_speakable_mapped(text, track=words), words)
        if not out:
            raise NothingToSay("text has nothing to speak after normalization", field="text")
        return out

    def run_sentences(self, run: ScriptRun, words: bool = False) -> list[Sentence]:
        """The sentences of one run of a script (SSML), possibly none; word spans point into
        the document the run came from.

        A run without phonemes given is read as text is. A run with some (``phoneme``, a
        lexicon's pronunciation) is read piece by piece: each text piece phonemized as usual,
        the given symbols put between them as they are, and one sentence made of all that is
        between two of the text's sentence ends, so a word said by its phonemes stays in its
        sentence's intonation."""
        text = "".join(p.text for p in run.pieces)
        require_script(text, self.voice)
        if all(p.phonemes is None for p in run.pieces):
            spans = _spans(run.pieces) if words else None
            try:
                mapped = require_speakable_mapped(text, words, spans)
            except NothingToSay:
                return []
            return self._sentences(mapped, words)
        return self._mixed(run.pieces, words)

    def _mixed(self, pieces: tuple[ScriptText, ...], words: bool) -> list[Sentence]:
        id_map = self.voice.phoneme_id_map
        out: list[Sentence] = []
        phonemes: list[str] = []
        said: list[SpokenWord] = []
        texts: list[str] = []

        def close() -> None:
            ids = phoneme_ids(phonemes, id_map)
            if len(ids) > 3:
                out.append(Sentence(" ".join(texts), tuple(phonemes), tuple(ids), tuple(said)))
            phonemes.clear()
            said.clear()
            texts.clear()

        def join(more: list[str]) -> int:
            """Append ``more`` after a word space; the id position its first phoneme takes."""
            if phonemes:
                phonemes.append(" ")
            shift = _id_count(phonemes, id_map)
            phonemes.extend(more)
            return shift

        def room(size: int) -> None:
            """Cut before ``size`` more symbols would pass the sentence cap: no sentence end in
            sight (a list of lexicon words), and the model reads a sentence at once."""
            if phonemes and len(phonemes) + size >= self.max_sentence_chars:
                close()

        for group in _groups(pieces):
            if group[0].phonemes is not None:
                piece = group[0]
                assert piece.phonemes is not None
                room(piece.size)
                shift = join(list(unicodedata.normalize("NFD", piece.phonemes)))
                texts.append(piece.text)
                count = _id_count(phonemes, id_map) - shift
                if words and count > 0:
                    first = len(id_map[BOS]) + len(id_map[PAD]) + shift
                    said.append(SpokenWord(piece.text or piece.phonemes, piece.source,
                                           (first, first + count)))  # fmt: skip
                continue
            text = "".join(p.text for p in group)
            try:
                mapped = require_speakable_mapped(text, words, _spans(group) if words else None)
            except NothingToSay:
                continue
            found = self._sentences(mapped, words)
            for k, sentence in enumerate(found):
                if k > 0:
                    close()
                else:
                    room(len(sentence.phonemes))
                shift = join(list(sentence.phonemes))
                texts.append(sentence.text)
                said.extend(SpokenWord(w.text, w.span, (w.ids[0] + shift, w.ids[1] + shift))
                            for w in sentence.words)  # fmt: skip
            if found and ends_sentence(mapped.text):
                close()
        close()
        return out

    def _sentences(self, mapped: Normalized, words: bool) -> list[Sentence]:
        """The sentences of normalized text, with their words if asked for (possibly none)."""
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
        return out


_ENDS_SENTENCE_RE = re.compile(r"[.!?…。！？][\"'”’)\]]*\s*$")


def ends_sentence(text: str) -> bool:
    """Whether ``text`` ends with a sentence's end (a script's run that does is followed by
    the sentence pause; one that ends mid-sentence, at a rate change, is not)."""
    return _ENDS_SENTENCE_RE.search(text) is not None


def _spans(pieces: Iterable[ScriptText]) -> list[Span]:
    """Per character of the pieces joined, the span of the document it came from."""
    spans: list[Span] = []
    for piece in pieces:
        a, b = piece.source
        if piece.verbatim and b - a == len(piece.text):
            spans.extend((a + i, a + i + 1) for i in range(len(piece.text)))
        else:
            spans.extend([(a, b)] * len(piece.text))
    return spans


def _groups(pieces: Iterable[ScriptText]) -> list[list[ScriptText]]:
    """Runs of text pieces, and each piece with phonemes on its own."""
    groups: list[list[ScriptText]] = []
    for piece in pieces:
        if piece.phonemes is not None or not groups or groups[-1][0].phonemes is not None:
            groups.append([piece])
        else:
            groups[-1].append(piece)
    return groups


def _id_count(phonemes: Iterable[str], id_map: Mapping[str, Sequence[int]]) -> int:
    """How many ids ``phonemes`` take after BOS (each mapped phoneme and the pad after it)."""
    pad = len(id_map[PAD])
    return sum(len(id_map[p]) + pad for p in phonemes if p in id_map)
