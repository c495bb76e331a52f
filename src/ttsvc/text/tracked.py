"""Text being rewritten that remembers, per character, the span of the original it came from.

Why this exists: word timestamps name the span of the request text each spoken word came from, so
every normalization rewrite edits a ``Tracked`` text that keeps, per character, the span of the
original text it stands for: kept characters keep theirs, a rewritten match ("$12.50" ->
"twelve dollars and fifty cents") gives each of its new characters the span of the whole match.
``Normalized`` is the finished text with its spans, as the word-timing code reads it.
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = ["Edit", "Normalized", "Span", "Tracked"]

Span = tuple[int, int]
Edit = tuple[int, int, str]
"""Replace ``text[start:end]`` with the string."""


@dataclass(frozen=True)
class Normalized:
    """Normalized text with, per character, the ``[start, end)`` span of the text it came from."""

    text: str
    spans: tuple[Span, ...]

    def source(self, start: int, end: int) -> Span:
        """The span of the original text that ``text[start:end]`` came from."""
        if start >= end:
            at = self.spans[start][0] if start < len(self.spans) else self._end()
            return at, at
        covered = self.spans[start:end]
        return min(a for a, _ in covered), max(b for _, b in covered)

    def _end(self) -> int:
        return self.spans[-1][1] if self.spans else 0


_WORD_RE = re.compile(r"\w+")


class Tracked:
    """A text being rewritten, with the source span of each of its characters (``track``; not
    kept otherwise: plain ``normalize`` pays nothing for them)."""

    def __init__(self, text: str, track: bool = True) -> None:
        self.text = text
        self.track = track
        self.spans: list[Span] = [(i, i + 1) for i in range(len(text))] if track else []

    def edit(self, edits: Iterable[Edit]) -> None:
        """Apply non-overlapping ``edits`` in increasing order of position."""
        out: list[str] = []
        spans: list[Span] = []
        pos = 0
        for start, end, new in edits:
            out.append(self.text[pos:start])
            out.append(new)
            if self.track:
                spans.extend(self.spans[pos:start])
                spans.extend(self._new_spans(start, end, new))
            pos = end
        if not out:
            return
        out.append(self.text[pos:])
        self.text = "".join(out)
        if self.track:
            spans.extend(self.spans[pos:])
            self.spans = spans

    def _new_spans(self, start: int, end: int, new: str) -> list[Span]:
        """Spans for ``new`` replacing ``text[start:end]``: a word of ``new`` written the same in
        the replaced text keeps its own span ("J. R." -> "J R"), anything else the whole's."""
        if start < end:
            covered = self.spans[start:end]
            whole = (min(a for a, _ in covered), max(b for _, b in covered))
        else:  # an insertion: zero width where it was inserted
            at = self.spans[start][0] if start < len(self.spans) else (
                self.spans[-1][1] if self.spans else 0)  # fmt: skip
            whole = (at, at)
        spans = [whole] * len(new)
        old, cursor = self.text[start:end], 0
        for word in _WORD_RE.finditer(new):
            found = old.find(word.group(0), cursor)
            if found < 0:
                continue
            for k in range(len(word.group(0))):
                spans[word.start() + k] = self.spans[start + found + k]
            cursor = found + len(word.group(0))
        return spans

    def sub(self, pattern: re.Pattern[str], repl: str | Callable[[re.Match[str]], str]) -> None:
        """``pattern.sub(repl, text)``, tracked."""
        render = repl if callable(repl) else (lambda _m: repl)
        self.edit((m.start(), m.end(), render(m)) for m in pattern.finditer(self.text))

    def chars(self, mapping: Callable[[str], str | None]) -> None:
        """Replace single characters: ``mapping`` gives the replacement, ``None`` to keep one."""
        edits = []
        for i, ch in enumerate(self.text):
            new = mapping(ch)
            if new is not None and new != ch:
                edits.append((i, i + 1, new))
        self.edit(edits)

    def strip(self) -> None:
        kept = self.text.strip()
        if kept == self.text:
            return
        start = len(self.text) - len(self.text.lstrip())
        self.edit([(0, start, ""), (start + len(kept), len(self.text), "")])

    def nfc(self) -> None:
        """Unicode NFC, run by runs that start at a character of combining class 0 (only those
        change); the whole text at once where that would not give NFC's exact result."""
        target = unicodedata.normalize("NFC", self.text)
        if target == self.text:
            return
        if not self.track:
            self.text = target
            return
        edits: list[Edit] = []
        starts = [i for i, ch in enumerate(self.text) if unicodedata.combining(ch) == 0]
        bounds = [0, *[i for i in starts if i > 0], len(self.text)]
        for a, b in itertools.pairwise(bounds):
            run = self.text[a:b]
            composed = unicodedata.normalize("NFC", run)
            if composed != run:
                edits.append((a, b, composed))
        trial = Tracked(self.text)
        trial.spans = list(self.spans)
        trial.edit(edits)
        if trial.text != target:
            trial = Tracked(self.text)
            trial.spans = list(self.spans)
            trial.edit([(0, len(self.text), target)])
        self.text, self.spans = trial.text, trial.spans
