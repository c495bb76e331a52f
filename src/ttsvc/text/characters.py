"""Character-level passes: Unicode clean-up before the rewrites, symbols said as words, and what
espeak-ng should not hear dropped after them.

Why this exists: the text comes straight from API clients, and a stray "*", "#" or emoji may be
spoken as a symbol name or derail the intonation. :func:`clean` runs first (NFC; controls,
invisible characters and selectors out; whitespace folded), ``DEGREES_RE`` and ``SYMBOL_RE`` turn
"°C", "&", "+" and the like into words, and :func:`drop_unspeakable` runs after every rewrite,
turning the symbols, emoji and unassigned code points still left into spaces.
"""

from __future__ import annotations

import re
import unicodedata

from ttsvc.text.tracked import Edit, Tracked

__all__ = [
    "DEGREES_RE",
    "SYMBOL_RE",
    "WS_RE",
    "clean",
    "drop_unspeakable",
    "render_degrees",
    "render_symbol",
]

WS_RE = re.compile(r"\s+")


def _is_selector(ch: str) -> bool:
    # Variation selectors only pick emoji or text presentation; keycap and other enclosing marks
    # (category Me) only decorate. Removed first so "7\ufe0f\u20e3" is just "7".
    return 0xFE00 <= ord(ch) <= 0xFE0F or 0xE0100 <= ord(ch) <= 0xE01EF


def clean(text: Tracked) -> None:
    """NFC; controls, invisible format characters and selectors out; whitespace folded."""
    text.nfc()
    edits: list[Edit] = []
    on_letter = False
    for i, ch in enumerate(text.text):
        category = unicodedata.category(ch)
        if ch.isspace():
            if ch != " ":
                edits.append((i, i + 1, " "))
        elif category in ("Cc", "Cf", "Cs", "Me") or _is_selector(ch):
            edits.append((i, i + 1, ""))
            continue
        elif category[0] == "M":
            # Only a letter carries a mark through the rewrites below. On a digit, symbol or
            # nothing it would end up glued to whatever word replaces its neighbour.
            if not on_letter:
                edits.append((i, i + 1, " "))
            continue
        elif ch == "−":  # U+2212 MINUS SIGN: one spelling of minus for the number patterns
            edits.append((i, i + 1, "-"))
        on_letter = ch.isalpha()
    text.edit(edits)
    text.sub(WS_RE, " ")
    text.strip()


DEGREES_RE = re.compile(r"°\s?(?P<unit>[CF])(?![A-Za-z])")
SYMBOL_RE = re.compile(r"[&+=@×°]")
_SYMBOL_WORDS = {"&": "and", "+": "plus", "=": "equals", "@": "at", "×": "times", "°": "degrees"}


def render_degrees(match: re.Match[str]) -> str:
    return " degrees Celsius " if match["unit"] == "C" else " degrees Fahrenheit "


def render_symbol(match: re.Match[str]) -> str:
    return f" {_SYMBOL_WORDS[match.group(0)]} "


# Punctuation espeak may name aloud ("asterisk", "slash") or that carries no prosody; the
# symbols it expands have been turned into words by the time this is applied.
_DROP_PUNCTUATION = frozenset("#%*/\\_|~^`<>{}§¶†‡•‰‱′″‴※·")


def drop_unspeakable(text: Tracked) -> None:
    """Symbols, emoji and unassigned or private code points become spaces.

    A combining mark is kept only on a letter or digit: stranded (its emoji base dropped, say) it
    would otherwise be read as a character name or break the phonemizer's word segmentation.
    """
    edits: list[Edit] = []
    on_base = False
    for i, ch in enumerate(text.text):
        category = unicodedata.category(ch)
        if category[0] == "M":
            # A space, not nothing, so the neighbours of a stranded mark stay apart.
            if not on_base:
                edits.append((i, i + 1, " "))
            continue
        if category[0] == "S" or category in ("Co", "Cn", "Cs") or ch in _DROP_PUNCTUATION:
            edits.append((i, i + 1, " "))
            on_base = False
            continue
        on_base = ch.isalnum()
    text.edit(edits)
