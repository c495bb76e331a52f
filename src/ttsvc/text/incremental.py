"""Sentences from text that arrives in pieces (an LLM's tokens), as soon as each is complete.

Pure: no IO, no clock. A sentence is complete once text after its end has arrived: only the
next visible character tells whether "Dr." or "Wait..." ended a sentence (``segment`` merges
"Dr. Smith" and "Wait... what"), so the last sentence seen is held until more text comes, or
until ``flush``. Boundaries are ``split_sentences``'s own, so incremental text is cut exactly
where the same text sent whole would be.

The held text stays short: ``split_sentences`` cuts a run-on past ``max_chars`` at clauses,
then spaces, so everything but the last piece of at most ``max_chars`` is handed out.
"""

from __future__ import annotations

from ttsvc.text.segment import _OPENERS, split_sentences

__all__ = ["SentenceBuffer"]


class SentenceBuffer:
    """Text appended piece by piece in, complete sentences out, in order.

    Not thread-safe; one per stream of text.
    """

    def __init__(self, max_chars: int) -> None:
        if max_chars < 1:
            raise ValueError(f"max_chars must be at least 1, got {max_chars}")
        self.max_chars = max_chars
        self._pending = ""

    @property
    def pending(self) -> str:
        """Text received that is not yet part of a sentence handed out."""
        return self._pending

    def append(self, text: str) -> list[str]:
        """Add ``text``; returns the sentences it completed, in order (often none)."""
        if not text:
            return []
        self._pending += text
        pending = self._pending
        # a boundary is final once a character that is neither space nor an opening quote or
        # bracket follows it: segmentation looks past those to judge an ending
        last = len(pending) - 1
        while last >= 0 and (pending[last].isspace() or pending[last] in _OPENERS):
            last -= 1
        out: list[str] = []
        cursor = held = 0
        # pieces are stripped substrings of the text, in order, so each is found from the last
        for piece in split_sentences(pending, self.max_chars):
            start = pending.index(piece, cursor)
            cursor = start + len(piece)
            if cursor > last:
                break
            out.append(piece)
            held = cursor
        self._pending = pending[held:].lstrip() if out else pending
        return out

    def flush(self) -> list[str]:
        """Everything pending, as a sentence (cut like any other past ``max_chars``); none if
        it is blank."""
        pending, self._pending = self._pending, ""
        return split_sentences(pending, self.max_chars)
