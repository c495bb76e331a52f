"""Text that arrives in pieces (an LLM's tokens, Home Assistant's streamed reply) → sentences.

Why: a sentence is the unit of synthesis, and speaking it as soon as it is complete, while the
rest of the reply is still being written, is what makes a voice agent answer without waiting for
the whole text. The boundaries are the project's own segmenter's (``ttsvc.text.segment``), so a
text streamed in pieces is cut where the same text sent whole would be; the only difference is
when: a sentence is complete once the text after its end has arrived (a full stop alone may still
be "Dr." or "3."), or when the sender says there is no more.

Pure: no IO, no clock; one buffer per stream of text.
"""

from __future__ import annotations

from ttsvc.text.segment import complete_prefix, split_long, split_sentences

__all__ = ["SentenceBuffer"]


class SentenceBuffer:
    """Collects text pieces and hands out each sentence once, in order, as soon as it is complete.

    ``max_chars`` bounds a sentence that never ends (a list with no full stops, a pasted log): once
    the pending text is longer, its leading pieces are cut at the clause or word boundaries the
    segmenter would use for a sentence over its cap, and only the last piece (which may still grow)
    waits for more.
    """

    def __init__(self, max_chars: int) -> None:
        if max_chars < 1:
            raise ValueError(f"max_chars must be at least 1, got {max_chars}")
        self.max_chars = max_chars
        self._pending = ""

    @property
    def pending(self) -> str:
        """The text received but not yet handed out as a sentence."""
        return self._pending

    def append(self, text: str) -> list[str]:
        """Add ``text``; returns the sentences it completed, in order (often none)."""
        self._pending += text
        out: list[str] = []
        end = complete_prefix(self._pending)
        if end:
            out = split_sentences(self._pending[:end], self.max_chars)
            self._pending = self._pending[end:]
        if len(self._pending.strip()) > self.max_chars:
            *full, _rest = split_long(self._pending, self.max_chars)
            at = 0
            for piece in full:  # pieces are substrings of the pending text, in order
                at = self._pending.index(piece, at) + len(piece)
            out.extend(full)
            self._pending = self._pending[at:]
        return out

    def flush(self) -> list[str]:
        """Everything pending, as a sentence (none if it is blank); the buffer is then empty."""
        pending, self._pending = self._pending, ""
        return split_sentences(pending, self.max_chars)
