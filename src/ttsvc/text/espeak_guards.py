"""Bounds on the two word shapes known to crash espeak-ng: dot-joined letters, over-long words.

Why this exists: the espeak-ng 1.51 fork the voice was trained with keeps some per-word work in
fixed-size stack buffers and overflows them on shapes any client can type, killing the process
that runs it. The two shapes found are bounded here, far beyond any real word or abbreviation, so
text a person would write passes unchanged. ``ttsvc.text.phonemize`` contains whatever is left;
``ttsvc.text.poison`` lists the texts that crashed it.
"""

from __future__ import annotations

import re
import unicodedata

from ttsvc.text.tracked import Edit, Tracked

__all__ = ["bound_dotted_letters", "bound_words"]

_MAX_DOTTED_LETTERS = 8
"""Single letters one dotted abbreviation may join ("a.b.c", ". b . c" alike). espeak-ng copies
them into an 80-byte buffer to spell them; 8 letters of at most 4 UTF-8 bytes each stay far inside
it, and real abbreviations ("U.S.A.", "R.S.V.P.") are shorter."""
_MAX_WORD_CHARS = 64
"""Longest run without whitespace handed to espeak-ng. One word that repeats a suffix ("s's's'",
"s?s?s?") grows a 200-byte phoneme buffer by a few bytes per suffix; 32 two-character suffixes
stay inside it. The longest English dictionary words have 45 letters."""
_NON_SPACE_RUN_RE = re.compile(rf"\S{{{_MAX_WORD_CHARS + 1},}}")
# Where espeak-ng may end a clause: punctuation right after a word and before a space. A dot ends
# it only before a word that is not lowercase ("b. C"): "b. c" reads as an abbreviation going on,
# as does a dot anywhere else between two single letters ("b.c", "b .c", "b . c").
_CLAUSE_END_RE = re.compile(r"\S([.,;:!?])\s+")


def _in_word(ch: str) -> bool:
    return ch.isalnum() or unicodedata.category(ch)[0] == "M"


def bound_words(text: Tracked) -> None:
    """Cut every run of more than ``_MAX_WORD_CHARS`` non-space characters with spaces."""

    def cut(match: re.Match[str]) -> str:
        run, pieces, start = match.group(0), [], 0
        while len(run) - start > _MAX_WORD_CHARS:
            end = start + _MAX_WORD_CHARS
            # keep combining marks with their base letter
            while end - 1 > start and unicodedata.category(run[end])[0] == "M":
                end -= 1
            pieces.append(run[start:end])
            start = end
        pieces.append(run[start:])
        return " ".join(pieces)

    text.sub(_NON_SPACE_RUN_RE, cut)


def _ends_clause(text: str, start: int, end: int) -> bool:
    """Whether espeak-ng may end a clause in ``text[start:end]`` (``text[end]`` is not a space)."""
    return any(
        m.group(1) != "." or not text[m.end()].islower()
        for m in _CLAUSE_END_RE.finditer(text, start, end)
    )


def bound_dotted_letters(tracked: Tracked) -> None:
    """Break chains of more than ``_MAX_DOTTED_LETTERS`` dot-joined single letters with ", ".

    A single letter is one with no letter, digit or mark on either side. The comma ends espeak-ng's
    clause, and with it the abbreviation it was collecting.
    """
    text = tracked.text
    edits: list[Edit] = []
    chain = 0
    previous = -1  # index just past the previous single letter; -1: none yet
    last = len(text) - 1
    for i, ch in enumerate(text):
        if not ch.isalpha() or (i > 0 and _in_word(text[i - 1])):
            continue
        if i < last and _in_word(text[i + 1]):
            continue
        link = text[previous:i] if previous >= 0 else ""
        joined = (
            "." in link
            and not any(_in_word(c) for c in link)
            and not _ends_clause(text, previous - 1, i)
        )
        if not joined:
            chain = 1
        elif chain < _MAX_DOTTED_LETTERS:
            chain += 1
        else:
            edits.append((previous, i, ", "))
            chain = 1
        previous = i + 1
    tracked.edit(edits)
