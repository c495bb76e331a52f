"""Spoken words back to the request text: spans through normalization, and espeak-ng's words
(joined, split) aligned with the text's."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from ttsvc.text.frontend import TextFrontEnd
from ttsvc.text.normalize import normalize, normalize_mapped
from ttsvc.text.words import align, id_positions, phoneme_words
from ttsvc.voice import VoiceConfig

CORPUS = Path(__file__).with_name("corpus.txt")


def said(frontend: TextFrontEnd, text: str) -> list[tuple[str, str]]:
    """Each spoken word and the request text its span names."""
    return [(w.text, text[w.span[0] : w.span[1]])
            for s in frontend.sentences(text, words=True) for w in s.words]  # fmt: skip


@pytest.fixture(scope="module")
def frontend(voice_config: VoiceConfig) -> TextFrontEnd:
    return TextFrontEnd(voice_config)


ODD = (
    "  Cafe\u0301 \u2212 5\u00a0\u00b0C, 1/2 of 24/7 \U0001f600 ok",
    "a.b.c.d.e.f.g.h.i.j.k.l",
    "x" * 150,
    "",
    "\u1100\u1161 \u0041\u030a\u0301 \ufe0f7\ufe0f\u20e3",
)
"""Decomposed accents, Hangul jamo (NFC joins two starters), selectors, very long words."""


@pytest.mark.parametrize("text", [*CORPUS.read_text(encoding="utf-8").splitlines(), *ODD])
def test_mapped_normalization_is_normalization(text: str) -> None:
    """The tracked rewrite gives exactly the text the plain one does, a span per character."""
    mapped = normalize_mapped(text)
    assert mapped.text == normalize(text)
    assert len(mapped.spans) == len(mapped.text)
    assert all(0 <= a <= b <= len(text) for a, b in mapped.spans)


def test_a_rewritten_form_gives_its_span_to_every_word_made_of_it(frontend: TextFrontEnd) -> None:
    text = "It costs $12.50 today."
    assert said(frontend, text) == [
        ("It", "It"), ("costs", "costs"), ("twelve", "$12.50"), ("dollars", "$12.50"),
        ("and", "$12.50"), ("fifty", "$12.50"), ("cents", "$12.50"), ("today", "today"),
    ]  # fmt: skip


def test_kept_words_keep_their_own_spans_inside_a_rewrite(frontend: TextFrontEnd) -> None:
    text = "J. R. R. Tolkien met Dr. Smith on March 5."
    assert said(frontend, text) == [
        ("J", "J"), ("R", "R"), ("R", "R"), ("Tolkien", "Tolkien"), ("met", "met"),
        ("Doctor", "Dr."), ("Smith", "Smith"), ("on", "on"), ("March", "March"),
        ("fifth", "March 5"),
    ]  # fmt: skip


def test_words_espeak_joins_or_splits_are_each_found(frontend: TextFrontEnd) -> None:
    """espeak-ng says "of the" as one word and "example.com" as three: every written word still
    gets its own ids, in order, and none overlaps another."""
    text = "Of the people, wait... what? Visit example.com for the 123 cats."
    sentences = frontend.sentences(text, words=True)
    words = [w for s in sentences for w in s.words]
    assert [w.text for w in words] == ["Of", "the", "people", "wait", "what", "Visit",
                                       "example.com", "for", "the", "123", "cats"]  # fmt: skip
    for sentence in sentences:
        ids = [w.ids for w in sentence.words]
        assert all(a < b for a, b in ids)
        assert all(prev[1] <= nxt[0] for prev, nxt in itertools.pairwise(ids))
        assert all(b <= len(sentence.ids) - 1 for _, b in ids)  # never past EOS


def test_a_joined_phoneme_word_is_cut_between_its_tokens(frontend: TextFrontEnd) -> None:
    spoken = ["ʌvðə", "pˈiːpəl"]
    alone = [(0, "ʌv"), (1, "ðə"), (2, "pˈiːpəl")]
    assert align(spoken, alone) == [[(0, "ʌv"), (1, "ðə")], [(2, "piːpəl")]]
    # in context "for the" is "fɚðə", alone "fˈɔːɹ" + "ðə": "the" is still its two phonemes
    (sentence,) = frontend.sentences("For the people.", words=True)
    assert "".join(sentence.phonemes).startswith("fɚðə ")
    the = sentence.words[1]
    assert the.text == "the"
    layout = id_positions(sentence.phonemes, frontend.voice.phoneme_id_map)
    assert the.ids == (layout[2][0], layout[3][1])  # type: ignore[index]


def test_phoneme_words_leave_out_spaces_and_punctuation() -> None:
    assert phoneme_words(list("ɐ bˈɔɪ, hˈiː.")) == [[0], [2, 3, 4, 5], [8, 9, 10, 11]]
