"""Sentence segmentation of normalized text.

Why sentences: they are the unit of streaming. Each one is phonemized and synthesized on its own,
so the first audio reaches the client after one sentence's worth of work instead of the whole
request's, and a short first piece means a short time to first byte. Sentences are also where a
speaker naturally resets intonation, so cutting there costs nothing audible.

Why a length cap: the acoustic model's cost and memory grow with input length, and a run-on
"sentence" (a pasted log line, a list with no full stops) would stall the stream. Long sentences
are therefore cut again at clause punctuation, then at spaces, and only as a last resort mid-word.

The input is normally already normalized (numbers and abbreviations expanded), but the rules stay
defensive: a "." followed by a digit or letter ("3.14", "example.com") is never a boundary, and
known abbreviations and initials ("Dr.", "e.g.", "J. R. R. Tolkien") do not end a sentence. A
wrong merge only delays audio a little; a wrong split breaks the prosody mid-phrase, so doubtful
cases merge.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["complete_prefix", "split_long", "split_sentences"]

_CLOSERS = "\"'”’)]}»」』"
_OPENERS = "\"'“‘([{«「『"

# A run of terminators, any closing quotes or brackets, then whitespace or the end. The
# look-behind makes a match start only at the beginning of a run, which keeps long runs of
# punctuation linear. CJK full stops need no following space.
_TERMINATOR_RE = re.compile(
    r"(?<![.!?…])[.!?…]+[\"'”’)\]}»」』]*(?=\s|$)|(?<![。！？])[。！？]+[」』”’)]*"
)
# Clause boundaries, strongest first: each pattern ends where a piece may be cut.
_CLAUSE_LEVELS = (
    re.compile(r"[;:](?=\s)|[—―]\s*|\s[–-](?=\s)"),
    re.compile(r",(?=\s)|[、，]"),
    re.compile(r"\s+"),
)
_ACRONYM_RE = re.compile(r"(?:[A-Za-z]\.)+[A-Za-z]")

_ABBREVIATIONS = frozenset(
    {
        "Dr", "Mr", "Mrs", "Ms", "Prof", "St", "Mt", "Capt", "Lt", "Col", "Gen", "Gov", "Sgt",
        "Rev", "Hon", "Fig", "fig", "No", "Nos", "no", "vs", "approx", "cf", "al", "Jan", "Feb",
        "Mar", "Apr", "Jun", "Jul", "Aug", "Sep", "Sept", "Oct", "Nov", "Dec",
    }
)  # fmt: skip
# Abbreviations are short; looking further back than this cannot find one.
_MAX_ABBREVIATION_LOOKBACK = 16


def _word_before(text: str, end: int) -> str:
    start = end
    while start > 0 and not text[start - 1].isspace():
        start -= 1
        if end - start > _MAX_ABBREVIATION_LOOKBACK:
            return ""
    return text[start:end].lstrip(_OPENERS)


def _next_visible(text: str, end: int) -> str:
    i, n = end, len(text)
    while i < n and (text[i].isspace() or text[i] in _OPENERS):
        i += 1
    return text[i] if i < n else ""


def _is_boundary(text: str, match: re.Match[str]) -> bool:
    run = match.group(0).rstrip(_CLOSERS)
    if any(ch in run for ch in "!?。！？"):
        return True
    following = _next_visible(text, match.end())
    if not following:
        return True
    if following.islower():
        # "I was... thinking", an unknown abbreviation before a lowercase word: not an ending.
        return False
    if run != ".":
        return True
    word = _word_before(text, match.start())
    if word in _ABBREVIATIONS or _ACRONYM_RE.fullmatch(word):
        return False
    # A single capital before a capitalized word is most likely an initial ("J. R. R. Tolkien").
    return not (len(word) == 1 and word.isupper() and following.isupper())


def _hard_split(piece: str, max_chars: int) -> list[str]:
    out: list[str] = []
    i, n = 0, len(piece)
    while i < n:
        cut = min(i + max_chars, n)
        # Keep combining marks with their base letter.
        while i + 1 < cut < n and unicodedata.category(piece[cut])[0] == "M":
            cut -= 1
        chunk = piece[i:cut].strip()
        if chunk:
            out.append(chunk)
        i = cut
    return out


def _split_long(piece: str, max_chars: int, level: int = 0) -> list[str]:
    """Cut ``piece`` (stripped) at the strongest boundaries that bring it under ``max_chars``."""
    if len(piece) <= max_chars:
        return [piece]
    if level == len(_CLAUSE_LEVELS):
        return _hard_split(piece, max_chars)
    cuts = [m.end() for m in _CLAUSE_LEVELS[level].finditer(piece)]
    bounds = zip([0, *cuts], [*cuts, len(piece)], strict=True)
    segments = [piece[a:b] for a, b in bounds if a < b]
    if len(segments) <= 1:
        return _split_long(piece, max_chars, level + 1)
    # Greedy packing: as many consecutive clauses per piece as fit, so pieces stay long enough to
    # carry natural prosody.
    out: list[str] = []
    current = ""
    for segment in segments:
        candidate = current + segment
        if len(candidate.strip()) <= max_chars:
            current = candidate
            continue
        if current.strip():
            out.append(current.strip())
        stripped = segment.strip()
        if len(stripped) <= max_chars:
            current = segment
        else:
            out.extend(_split_long(stripped, max_chars, level + 1))
            current = ""
    if current.strip():
        out.append(current.strip())
    return out


def split_long(piece: str, max_chars: int) -> list[str]:
    """Cut a run-on ``piece`` into stripped pieces of at most ``max_chars``, at the same clause,
    then word, boundaries ``split_sentences`` uses for a sentence over its cap."""
    if max_chars < 1:
        raise ValueError(f"max_chars must be at least 1, got {max_chars}")
    piece = piece.strip()
    return _split_long(piece, max_chars) if piece else []


def complete_prefix(text: str) -> int:
    """Length of the longest prefix of ``text`` that ends a sentence no further text can change.

    For text that arrives in pieces (an LLM's tokens): a terminator at the very end may still grow
    ("?" into "?!", a closing quote), and whether a full stop ends a sentence depends on what
    follows it ("Dr. Smith", "3.14", "and... then"), so a boundary counts only once what decides
    it has arrived. "!" and "?" end a sentence whatever follows, so a space after them is enough.
    The prefix splits like the whole text would: ``split_sentences(text[:n])`` gives the same
    sentences as the start of ``split_sentences(text)``.
    """
    end = 0
    for match in _TERMINATOR_RE.finditer(text):
        if match.end() == len(text) or not _is_boundary(text, match):
            continue
        run = match.group(0).rstrip(_CLOSERS)
        if _next_visible(text, match.end()) or any(ch in run for ch in "!?。！？"):
            end = match.end()
    return end


def ends_at_its_end(text: str) -> bool:
    """Whether ``text``, taken as all there is for now, ends a sentence at its end: its last
    run of terminators would be a boundary before a next sentence. Not "Dr.", "e.g." or an
    ellipsis ("and..." may go on in lowercase), which only what follows them decides.

    For text that arrives in messages meant as units (an agent's sentences): a message that
    ends a sentence can be spoken at once instead of waiting for the next message."""
    stripped = text.rstrip()
    runs = list(_TERMINATOR_RE.finditer(stripped))
    if not runs or runs[-1].end() != len(stripped):
        return False
    run = runs[-1].group(0).rstrip(_CLOSERS)
    if "…" in run or ".." in run:
        return False
    return complete_prefix(stripped + " A") == len(stripped)


def split_sentences(text: str, max_chars: int = 200) -> list[str]:
    """Split normalized ``text`` into stripped, non-empty sentences of at most ``max_chars``.

    Raises ValueError when ``max_chars`` is below 1 (a caller bug, not bad input); any ``text``
    is accepted.
    """
    if max_chars < 1:
        raise ValueError(f"max_chars must be at least 1, got {max_chars}")
    pieces: list[str] = []

    def emit(chunk: str) -> None:
        chunk = chunk.strip()
        if chunk:
            pieces.extend(_split_long(chunk, max_chars))

    start = 0
    for match in _TERMINATOR_RE.finditer(text):
        if _is_boundary(text, match):
            emit(text[start : match.end()])
            start = match.end()
    emit(text[start:])
    return pieces
