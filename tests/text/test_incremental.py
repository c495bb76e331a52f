"""Tests for ttsvc.text.incremental.SentenceBuffer: text in pieces → each sentence once, in order,
as soon as it is complete, cut where the same text sent whole is cut."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.text.test_segment import _fuzz_strings
from ttsvc.text.incremental import SentenceBuffer
from ttsvc.text.segment import split_sentences

CORPUS = (Path(__file__).with_name("corpus.txt")).read_text(encoding="utf-8")


def stream(pieces: list[str], max_chars: int = 200) -> list[list[str]]:
    """What the buffer hands out after each piece, then what ``flush`` gives."""
    buffer = SentenceBuffer(max_chars)
    return [buffer.append(piece) for piece in pieces] + [buffer.flush()]


def chunked(text: str, rng: random.Random, longest: int) -> list[str]:
    pieces, i = [], 0
    while i < len(text):
        n = rng.randint(1, longest)
        pieces.append(text[i : i + n])
        i += n
    return pieces


@pytest.mark.parametrize("longest", [1, 3, 8, 40])
def test_pieces_make_the_sentences_of_the_whole_text(longest: int) -> None:
    """Split anywhere (mid-word, mid-number, between a full stop and its quote), the corpus comes
    out as the very sentences ``split_sentences`` makes of it whole, each once, in order."""
    rng = random.Random(longest)
    text = " ".join(CORPUS.split("\n"))
    for _ in range(5):
        got = [s for out in stream(chunked(text, rng, longest)) for s in out]
        assert got == split_sentences(text, 200)


def test_fuzz_pieces_make_the_sentences_of_the_whole_text() -> None:
    """Any text (symbols, CJK full stops, control characters, combining marks), in any pieces."""
    rng = random.Random(7)
    for text in _fuzz_strings():
        pieces = chunked(text, rng, rng.choice([1, 4, 30]))
        assert [s for out in stream(pieces, 1000) for s in out] == split_sentences(text, 1000)


def test_a_sentence_is_handed_out_once_text_after_it_arrives() -> None:
    buffer = SentenceBuffer(200)
    assert buffer.append("Hello wor") == []
    assert buffer.append("ld.") == []  # "world." could still be "world.com" or "world..."
    assert buffer.append(" ") == []  # the next word decides ("Dr. Smith", "and... then")
    assert buffer.append("How") == ["Hello world."]
    assert buffer.append(" are you?") == []  # "?" could still grow into "?!"
    assert buffer.append(" ") == ["How are you?"]  # "?" ends a sentence whatever follows
    assert buffer.flush() == []


@pytest.mark.parametrize(
    ("pieces", "sentences"),
    [
        (["Dr", ". Smith is in. ", "Yes"], ["Dr. Smith is in."]),  # an abbreviation
        (["It cost $3", ".50 today. ", "OK"], ["It cost $3.50 today."]),  # a decimal point
        (["Wait...", " what", "? Go"], ["Wait... what?"]),  # ellipsis before lowercase
        (['She said "hi', "!", '" Then'], ['She said "hi!"']),  # a closing quote after "!"
        (["J. R. R. Tolkien wrote. ", "It"], ["J. R. R. Tolkien wrote."]),  # initials
    ],
)
def test_doubtful_full_stops_wait_for_what_decides_them(
    pieces: list[str], sentences: list[str]
) -> None:
    out = stream(pieces)
    assert [s for step in out[:-1] for s in step] == sentences
    assert out[-2] == sentences[-1:]  # handed out with the piece that decided it, not before


def test_flush_gives_what_is_pending_and_empties_the_buffer() -> None:
    buffer = SentenceBuffer(200)
    assert buffer.append("No full stop here") == []
    assert buffer.flush() == ["No full stop here"]
    assert buffer.flush() == []
    assert buffer.append("   \n ") == []
    assert buffer.flush() == []  # blank: nothing to say


def test_a_sentence_that_never_ends_is_cut_at_clauses_within_max_chars() -> None:
    text = "one, two, three, four; five six seven, eight nine ten, eleven twelve"
    words = text.split()
    buffer = SentenceBuffer(30)
    out: list[str] = []
    for word in words:
        out.extend(buffer.append(word + " "))
    assert out  # handed out before any flush: the text never ends a sentence
    out.extend(buffer.flush())
    assert all(len(piece) <= 30 for piece in out)
    assert " ".join(out).split() == words  # nothing lost, nothing repeated, in order
    assert all(piece.endswith((",", ";")) for piece in out[:-1])  # clause boundaries
    assert out[0] == "one, two, three, four;"  # the strongest clause boundary that fits


def test_an_endless_word_is_cut_at_max_chars() -> None:
    buffer = SentenceBuffer(20)
    out = [s for c in "x" * 50 for s in buffer.append(c)] + buffer.flush()
    assert "".join(out) == "x" * 50
    assert all(len(piece) <= 20 for piece in out)


def test_max_chars_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_chars"):
        SentenceBuffer(0)


MIXED = ("Dr. Smith paid $12.50 for it. Wait... what happened? It was J. R. R. Tolkien! "
         "She said \"stop.\" Then she left")  # fmt: skip


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_fixed_size_pieces_of_abbreviations_and_quotes_give_the_whole_texts_sentences(
    size: int,
) -> None:
    pieces = [MIXED[i : i + size] for i in range(0, len(MIXED), size)]
    out = stream(pieces)
    assert [s for step in out[:-1] for s in step] == split_sentences(MIXED)[:-1]
    assert out[-1] == ["Then she left"]


def test_a_sentence_waits_for_visible_text_after_its_end() -> None:
    buffer = SentenceBuffer(200)
    assert buffer.append("I saw Dr.") == []
    assert buffer.append(" Smith today.") == []  # "Dr." did not end it; nothing after "today."
    assert buffer.append(" ") == []  # whitespace does not tell: "today. and" would go on
    assert buffer.append("He") == ["I saw Dr. Smith today."]
    assert buffer.append(" waited... and") == []  # "..." before a lowercase word: no end
    assert buffer.append(" waited!") == []
    assert buffer.append(" Then") == ["He waited... and waited!"]
    assert buffer.pending.strip() == "Then"


def test_a_run_on_is_cut_as_it_arrives_and_little_is_held() -> None:
    buffer = SentenceBuffer(40)
    words = [f"word{i}, " if i % 4 == 3 else f"word{i} " for i in range(200)]
    out: list[str] = []
    for word in words:
        out += buffer.append(word)
        assert len(buffer.pending) <= 40 + len(word)
    out += buffer.flush()
    assert all(len(s) <= 40 for s in out)
    assert " ".join(out).split() == "".join(words).split()  # every word once, in order
    assert out[0].endswith(",")  # cut at a clause while the text still came
