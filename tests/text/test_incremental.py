"""Tests for ttsvc.text.incremental.SentenceBuffer: text in pieces, sentences out as they end."""

from __future__ import annotations

import random

import pytest

from tests.text.test_segment import FUZZ_ALPHABET
from ttsvc.text.incremental import SentenceBuffer
from ttsvc.text.segment import split_sentences

TEXT = ("Dr. Smith paid $12.50 for it. Wait... what happened? It was J. R. R. Tolkien! "
        "She said \"stop.\" Then she left")  # fmt: skip


def _feed(buffer: SentenceBuffer, pieces: list[str]) -> list[str]:
    out: list[str] = []
    for piece in pieces:
        out += buffer.append(piece)
    return out


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_pieces_of_any_size_give_the_sentences_of_the_whole_text(size: int) -> None:
    buffer = SentenceBuffer(200)
    pieces = [TEXT[i : i + size] for i in range(0, len(TEXT), size)]
    sentences = _feed(buffer, pieces)
    assert sentences == split_sentences(TEXT)[:-1]
    assert buffer.flush() == ["Then she left"]
    assert buffer.flush() == []


def test_a_sentence_is_held_until_text_after_its_end_tells_it_ended() -> None:
    buffer = SentenceBuffer(200)
    assert buffer.append("I saw Dr.") == []
    assert buffer.append(" Smith today.") == []  # "Dr." did not end it; nothing after "today."
    assert buffer.append(" ") == []  # whitespace does not tell: "today. and" would go on
    assert buffer.append("He") == ["I saw Dr. Smith today."]
    assert buffer.append(" waited... and") == []  # "..." before a lowercase word: no end
    assert buffer.append(" waited!") == []
    assert buffer.append(" Then") == ["He waited... and waited!"]
    assert buffer.pending == "Then"


def test_flush_speaks_what_is_pending_and_nothing_when_blank() -> None:
    buffer = SentenceBuffer(200)
    assert buffer.append("Half a thought") == []
    assert buffer.flush() == ["Half a thought"]
    assert buffer.append("   \n") == []
    assert buffer.flush() == []
    assert buffer.append("") == []
    assert buffer.flush() == []


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


def test_fuzz_random_pieces_give_the_sentences_of_the_whole() -> None:
    rng = random.Random(16)
    for _ in range(300):
        text = "".join(rng.choice(FUZZ_ALPHABET) for _ in range(rng.randint(0, 300)))
        buffer = SentenceBuffer(10_000)  # no length cuts: boundaries alone decide
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 40))))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        assert _feed(buffer, pieces) + buffer.flush() == split_sentences(text, 10_000), text


def test_max_chars_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_chars"):
        SentenceBuffer(0)
