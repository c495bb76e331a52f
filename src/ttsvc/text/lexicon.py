"""Pronunciation lexicons: W3C PLS 1.0 files (the format Amazon Polly and Azure take) and the
words of a text they apply to.

A file is one ``<lexicon version="1.0" alphabet="ipa" xml:lang="en-US"
xmlns="http://www.w3.org/2005/01/pronunciation-lexicon">`` of ``<lexeme>`` elements, each with
one or more ``<grapheme>`` (the written form: a word or words) and a pronunciation, an IPA
``<phoneme>`` or an ``<alias>`` (text to say instead). Where a lexeme has several
pronunciations, the first with ``prefer="true"`` is used, else the first in the file (PLS 1.0
section 4.6). ``<example>``, ``<meta>`` and ``<metadata>`` are allowed and ignored; any other
element is refused, so a typo is reported rather than silently doing nothing.

Safe by construction: the bytes are parsed by ``defusedxml`` with DTDs, entity declarations and
external references forbidden (no billion laughs, no XXE), after a size cap; the lexeme and
grapheme counts, grapheme length and nesting depth are capped too. A file that may not be used
raises ``LexiconError`` with its name, the line and column at fault and a reason an operator can
act on; nothing of a refused file is kept.

Matching (``Lexicon.find``) is one scan of one compiled regular expression per lexicon:

* **whole words only**: a grapheme matches where no word character (a letter, digit, ``_``, a
  combining mark or a zero-width joiner) is directly before or after it, so "ACME" does not
  match in "ACMEs" but does in "ACME's" and "ACME-based";
* **the case rule**: a grapheme written with any capital letter matches only exactly as written
  ("ACME" does not match "Acme"); an all-lowercase grapheme matches the word in any case
  ("acme" matches "acme", "Acme" and "ACME"). Where both forms are defined, the exact one wins;
* graphemes of several words match across any whitespace ("New York" matches "New\\nYork");
* at each place the longest grapheme wins, matches never overlap, and the text is read left to
  right; where two lexemes define the same grapheme, the first in the file wins.

``LexiconSet`` applies several lexicons at once: the first named wins where matches overlap.
"""

from __future__ import annotations

import bisect
import functools
import re
import unicodedata
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from xml.etree.ElementTree import ParseError

import defusedxml
import defusedxml.ElementTree

from ttsvc.errors import LexiconError, UnknownLexicon
from ttsvc.voice import NAME_RE, name_problem

__all__ = ["MAX_DEPTH", "MAX_FILE_BYTES", "MAX_GRAPHEMES", "MAX_GRAPHEME_CHARS", "MAX_LEXEMES",
           "MAX_PRONUNCIATION_CHARS", "NAME_RE", "PLS_NAMESPACE", "Lexeme", "Lexicon",
           "LexiconSet", "Match", "load_lexicon", "merge", "parse_lexicon"]  # fmt: skip

PLS_NAMESPACE = "http://www.w3.org/2005/01/pronunciation-lexicon"
_XML_NAMESPACE = "http://www.w3.org/XML/1998/namespace"

MAX_FILE_BYTES = 1 << 20
"""Largest file read: Polly's own cap is 4,000 characters per lexicon, Azure's 100 KB; a MiB
leaves room for a large team lexicon and bounds the parse."""
MAX_LEXEMES = 10_000
"""Most lexemes in one file: beyond it, the lexicon is a dictionary, not a list of fixes."""
MAX_GRAPHEMES = 20_000
"""Most graphemes in one file: each is one alternative of the lexicon's expression."""
MAX_GRAPHEME_CHARS = 100
"""Longest grapheme (after whitespace is collapsed): a few words, never a paragraph."""
MAX_PRONUNCIATION_CHARS = 500
"""Longest phoneme string or alias."""
MAX_DEPTH = 16
"""Deepest nesting: a lexicon needs three levels; ``metadata`` may hold a little RDF."""

_LANG_RE = re.compile(r"[A-Za-z]{2,8}(?:[-_][A-Za-z0-9]{1,8})*")
_IGNORED = frozenset({"example", "meta", "metadata"})


def _word_ranges() -> Iterator[tuple[int, int]]:
    """Code point ranges of combining marks, which ``\\w`` leaves out although they are part of
    a word (a decomposed "é", Devanagari's vowel signs)."""
    start = None
    for cp in [*range(0x20000), *range(0xE0100, 0xE01F0)]:
        mark = unicodedata.category(chr(cp)).startswith("M")
        if mark and start is None:
            start = cp
        elif not mark and start is not None:
            yield start, cp - 1
            start = None


@functools.cache
def _word_class() -> str:
    """A character class of everything that continues a word: computed once, on the first
    lexicon compiled (about 0.1 s), not at import, which workers also pay."""
    marks = "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in _word_ranges())
    return f"[\\w{marks}\\u200c\\u200d]"


@dataclass(frozen=True)
class Lexeme:
    """One entry of a lexicon: the written forms it applies to and what to say for them."""

    graphemes: tuple[str, ...]
    """The written forms, whitespace collapsed to single spaces, in the file's order."""
    phoneme: str | None
    """IPA to speak for them (whitespace-trimmed), or ``None`` where the lexeme has an alias."""
    alias: str | None
    """Text to say instead (whitespace collapsed), or ``None`` where it has a phoneme."""
    line: int
    """Line of the ``lexeme`` element in its file, for messages about it."""


@dataclass(frozen=True)
class Match:
    """A place in a text where a lexeme applies: ``text[start:end]`` is the word(s) it
    replaces."""

    start: int
    end: int
    lexeme: Lexeme
    lexicon: str
    """The name of the lexicon the lexeme is from."""


@dataclass(frozen=True)
class Lexicon:
    """A parsed lexicon, ready to match: its expression is compiled when it is made, so the cost
    (up to a fraction of a second for 10,000 graphemes) falls on the load, never on a request.
    Immutable: a reload makes a new one."""

    name: str
    lang: str
    """The file's ``xml:lang`` as written (``en-US``)."""
    entries: tuple[Lexeme, ...]
    _pattern: re.Pattern[str] | None = field(init=False, repr=False, compare=False)
    _exact: Mapping[str, Lexeme] = field(init=False, repr=False, compare=False)
    _folded: Mapping[str, Lexeme] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        exact: dict[str, Lexeme] = {}
        folded: dict[str, Lexeme] = {}
        for lexeme in self.entries:
            for grapheme in lexeme.graphemes:
                table = folded if grapheme == grapheme.lower() else exact
                table.setdefault(grapheme, lexeme)  # the first lexeme of a grapheme wins
        alternatives = [(g, False) for g in exact] + [(g, True) for g in folded]
        # longest first, so the alternation takes the longest grapheme at each place; at equal
        # length the exact forms first, so "ACME" beats "acme" on the text "ACME"
        alternatives.sort(key=lambda a: (-len(a[0]), a[1]))
        pattern = None
        if alternatives:
            word = _word_class()
            body = "|".join(_alternative(g, fold) for g, fold in alternatives)
            pattern = re.compile(f"(?<!{word})(?:{body})(?!{word})")
        object.__setattr__(self, "_pattern", pattern)
        object.__setattr__(self, "_exact", MappingProxyType(exact))
        object.__setattr__(self, "_folded", MappingProxyType(folded))

    def lookup(self, word: str) -> Lexeme | None:
        """The lexeme for ``word`` (a whole word or words) under the case rule, or ``None``."""
        key = " ".join(word.split())
        found = self._exact.get(key) or self._folded.get(key.lower())
        if found is None and self._folded and key:
            # re's case-insensitive match knows a few pairs str.lower does not (the long s)
            for grapheme, lexeme in self._folded.items():
                if len(grapheme) == len(key) and re.fullmatch(re.escape(grapheme), key, re.I):
                    return lexeme
        return found

    def find(self, text: str) -> list[Match]:
        """Where this lexicon's lexemes apply in ``text``: whole words, the case rule, longest
        first, left to right, without overlaps (see the module's docstring)."""
        if self._pattern is None:
            return []
        found = []
        for m in self._pattern.finditer(text):
            lexeme = self.lookup(m.group())
            if lexeme is not None:
                found.append(Match(m.start(), m.end(), lexeme, self.name))
        return found

    def applies_to(self, lang: str) -> bool:
        """Whether a voice speaking ``lang`` (``en_US``, ``en-us``) takes this lexicon: the same
        language tag, or this lexicon's tag is a prefix of it (``en`` applies to ``en-US``)."""
        mine, theirs = _tag(self.lang), _tag(lang)
        return theirs == mine or theirs.startswith(mine + "-")


def _tag(lang: str) -> str:
    return lang.replace("_", "-").lower()


def _alternative(grapheme: str, fold: bool) -> str:
    """One grapheme as a pattern: its words escaped and joined by any whitespace."""
    body = r"\s+".join(re.escape(word) for word in grapheme.split(" "))
    return f"(?i:{body})" if fold else body


def merge(groups: Iterable[Sequence[Match]]) -> list[Match]:
    """Matches of several lexicons as one list in text order: a match of an earlier group wins
    over any later one it overlaps."""
    taken: list[Match] = []
    starts: list[int] = []
    for group in groups:
        for match in group:
            i = bisect.bisect_right(starts, match.start)
            if i > 0 and taken[i - 1].end > match.start:
                continue  # overlaps the match before it
            if i < len(taken) and taken[i].start < match.end:
                continue  # overlaps the match after it
            taken.insert(i, match)
            starts.insert(i, match.start)
    return taken


@dataclass(frozen=True)
class LexiconSet:
    """The lexicons loaded at one moment, by name. Immutable: a request takes the store's
    current set once and uses it throughout, whatever reloads meanwhile."""

    lexicons: Mapping[str, Lexicon] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if not isinstance(self.lexicons, MappingProxyType):
            object.__setattr__(self, "lexicons", MappingProxyType(dict(self.lexicons)))

    def __contains__(self, name: object) -> bool:
        return name in self.lexicons

    def __len__(self) -> int:
        return len(self.lexicons)

    def get(self, name: str) -> Lexicon | None:
        return self.lexicons.get(name)

    def for_language(self, lang: str) -> tuple[str, ...]:
        """Names of the lexicons that apply to a voice speaking ``lang``, sorted."""
        return tuple(sorted(n for n, lex in self.lexicons.items() if lex.applies_to(lang)))

    def find(self, text: str, names: Sequence[str]) -> list[Match]:
        """Matches of the named lexicons in ``text``, in text order; where two overlap, the one
        from the lexicon named first wins. A name not loaded is an ``UnknownLexicon``."""
        missing = [n for n in names if n not in self.lexicons]
        if missing:
            known = ", ".join(sorted(self.lexicons)) or "none"
            raise UnknownLexicon(f"no lexicon named {missing[0]!r} is loaded (loaded: {known})",
                                 field="lexicons")  # fmt: skip
        return merge(self.lexicons[n].find(text) for n in dict.fromkeys(names))


# --- parsing -------------------------------------------------------------------------------


@dataclass
class _Node:
    """An element with the position of its start tag (ElementTree keeps none)."""

    tag: str
    attrs: dict[str, str]
    line: int
    column: int
    children: list[_Node] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    """Character data directly inside it (not inside its children)."""


class _Builder:
    """The parser's target: builds ``_Node``s with positions and enforces the depth cap."""

    def __init__(self, file: str, position: Callable[[], tuple[int, int]]) -> None:
        self.file = file
        self.position = position
        self.stack: list[_Node] = []
        self.root: _Node | None = None

    def start(self, tag: str, attrs: dict[str, str]) -> None:
        line, column = self.position()
        if len(self.stack) >= MAX_DEPTH:
            raise LexiconError(self.file, f"elements nest deeper than {MAX_DEPTH} levels",
                               line=line, column=column)  # fmt: skip
        node = _Node(tag, dict(attrs), line, column)
        if self.stack:
            self.stack[-1].children.append(node)
        else:
            self.root = node
        self.stack.append(node)

    def end(self, tag: str) -> None:
        self.stack.pop()

    def data(self, text: str) -> None:
        if self.stack:
            self.stack[-1].text.append(text)

    def close(self) -> _Node | None:
        return self.root


def _read_xml(data: bytes, file: str) -> _Node:
    """The document's elements, or a ``LexiconError`` at the parser's position."""
    parser: defusedxml.ElementTree.DefusedXMLParser
    builder = _Builder(file, lambda: (parser.parser.CurrentLineNumber,
                                      parser.parser.CurrentColumnNumber + 1))  # fmt: skip
    parser = defusedxml.ElementTree.DefusedXMLParser(
        target=builder, forbid_dtd=True, forbid_entities=True, forbid_external=True
    )
    try:
        parser.feed(data)
        parser.close()
    except ParseError as exc:
        line, column = exc.position
        reason = str(exc).split(":")[0]
        raise LexiconError(file, f"not well-formed XML: {reason}", line=line,
                           column=column + 1) from exc  # fmt: skip
    except defusedxml.DefusedXmlException as exc:
        line, column = builder.position()
        what = {"DTDForbidden": "a DOCTYPE (DTD)", "EntitiesForbidden": "an entity declaration",
                "ExternalReferenceForbidden": "an external reference"}.get(
                    type(exc).__name__, "unsafe XML")  # fmt: skip
        raise LexiconError(
            file,
            f"{what} is not allowed: a lexicon may have no DTD, entities or external references",
            line=line,
            column=column,
        ) from exc
    if builder.root is None:  # expat reports an empty document itself; kept for the type
        raise LexiconError(file, "no root element", line=1, column=1)
    return builder.root


def _local(node: _Node, file: str) -> str:
    """The element's name within the PLS namespace (an element of another is refused)."""
    namespace, _, local = node.tag.removeprefix("{").rpartition("}")
    if namespace != PLS_NAMESPACE:
        where = f"namespace {namespace!r}" if namespace else "no namespace"
        raise LexiconError(file, f"<{local}> is in {where}, not the PLS namespace "
                           f"{PLS_NAMESPACE!r}", line=node.line, column=node.column)  # fmt: skip
    return local


def _text(node: _Node, file: str, what: str) -> str:
    if node.children:
        child = node.children[0]
        raise LexiconError(file, f"<{what}> holds text only, not elements", line=child.line,
                           column=child.column)  # fmt: skip
    return "".join(node.text)


def _alphabet(node: _Node, inherited: str, file: str, at: _Node) -> str:
    alphabet = node.attrs.get("alphabet", inherited)
    if alphabet.strip().lower() != "ipa":
        raise LexiconError(file, f"alphabet {alphabet!r} is not supported: only \"ipa\"",
                           line=at.line, column=at.column)  # fmt: skip
    return alphabet


def _preferred(nodes: list[tuple[str, _Node]]) -> tuple[str, _Node]:
    """PLS 1.0 section 4.6: the first pronunciation with ``prefer="true"``, else the first."""
    for kind, node in nodes:
        if node.attrs.get("prefer", "false").strip() == "true":
            return kind, node
    return nodes[0]


def _lexeme(node: _Node, alphabet: str, file: str, symbols: Collection[str] | None) -> Lexeme:
    def refuse(reason: str) -> LexiconError:
        return LexiconError(file, reason, line=node.line, column=node.column)

    alphabet = _alphabet(node, alphabet, file, node)
    graphemes: list[str] = []
    pronunciations: list[tuple[str, _Node]] = []
    for child in node.children:
        local = _local(child, file)
        if local == "grapheme":
            grapheme = " ".join(_text(child, file, "grapheme").split())
            if not grapheme:
                raise refuse("a <grapheme> is empty")
            if len(grapheme) > MAX_GRAPHEME_CHARS:
                raise refuse(f"grapheme {grapheme[:40]!r}... is longer than "
                             f"{MAX_GRAPHEME_CHARS} characters")  # fmt: skip
            if not any(ch.isalnum() for ch in grapheme):
                raise refuse(f"grapheme {grapheme!r} has no letter or digit: it matches no "
                             "word")  # fmt: skip
            graphemes.append(grapheme)
        elif local in ("phoneme", "alias"):
            pronunciations.append((local, child))
        elif local not in _IGNORED:
            raise LexiconError(file, f"<{local}> is not a PLS 1.0 element of a <lexeme>",
                               line=child.line, column=child.column)  # fmt: skip
    if not graphemes:
        raise refuse("a <lexeme> without a <grapheme>")
    if not pronunciations:
        raise refuse(f"lexeme {graphemes[0]!r} has neither a <phoneme> nor an <alias>")
    kind, chosen = _preferred(pronunciations)
    if kind == "alias":
        alias = " ".join(_text(chosen, file, "alias").split())
        if not alias:
            raise refuse(f"lexeme {graphemes[0]!r} has an empty <alias>")
        if len(alias) > MAX_PRONUNCIATION_CHARS:
            raise refuse(f"lexeme {graphemes[0]!r}: its alias is longer than "
                         f"{MAX_PRONUNCIATION_CHARS} characters")  # fmt: skip
        return Lexeme(tuple(graphemes), None, alias, node.line)
    _alphabet(chosen, alphabet, file, node)
    phoneme = _text(chosen, file, "phoneme").strip()
    if not phoneme:
        raise refuse(f"lexeme {graphemes[0]!r} has an empty <phoneme>")
    if len(phoneme) > MAX_PRONUNCIATION_CHARS:
        raise refuse(f"lexeme {graphemes[0]!r}: its phoneme is longer than "
                     f"{MAX_PRONUNCIATION_CHARS} characters")  # fmt: skip
    if symbols is not None:
        for ch in phoneme:
            if not ch.isspace() and ch not in symbols:
                raise refuse(
                    f"lexeme {graphemes[0]!r}: phoneme {phoneme!r} has {ch!r} "
                    f"(U+{ord(ch):04X}), which is not an allowed phoneme symbol"
                )
    return Lexeme(tuple(graphemes), phoneme, None, node.line)


def parse_lexicon(
    data: bytes, file: str, *, name: str | None = None, symbols: Collection[str] | None = None
) -> Lexicon:
    """A PLS document's lexicon, or a ``LexiconError`` naming ``file``, the line and column at
    fault and why.

    ``name`` defaults to ``file``'s stem. ``symbols``, where given, are the phoneme symbols a
    ``phoneme`` may use (a voice's phoneme map): one outside them is refused here, at load,
    rather than dropped while speaking.
    """
    if len(data) > MAX_FILE_BYTES:
        raise LexiconError(file, f"the file has {len(data)} bytes, more than the "
                           f"{MAX_FILE_BYTES} a lexicon may have")  # fmt: skip
    name = Path(file).stem if name is None else name
    problem = name_problem(name, "lexicon")  # its file's stem: what requests name, never a path
    if problem is not None:
        raise LexiconError(file, problem)
    root = _read_xml(data, file)
    if _local(root, file) != "lexicon":
        raise LexiconError(file, "the root element must be <lexicon>", line=root.line,
                           column=root.column)  # fmt: skip

    def refuse(reason: str) -> LexiconError:
        return LexiconError(file, reason, line=root.line, column=root.column)

    if root.attrs.get("version") != "1.0":
        raise refuse(f"<lexicon version=...> must be \"1.0\", not "
                     f"{root.attrs.get('version')!r}")  # fmt: skip
    lang = root.attrs.get(f"{{{_XML_NAMESPACE}}}lang", "").strip()
    if not lang:
        raise refuse('<lexicon> needs xml:lang (the language it is for, e.g. "en-US")')
    if _LANG_RE.fullmatch(lang) is None:
        raise refuse(f"xml:lang {lang!r} is not a language tag")
    if "alphabet" not in root.attrs:
        raise refuse('<lexicon> needs alphabet="ipa"')
    alphabet = _alphabet(root, "ipa", file, root)
    entries: list[Lexeme] = []
    graphemes = 0
    for child in root.children:
        local = _local(child, file)
        if local == "lexeme":
            if len(entries) == MAX_LEXEMES:
                raise LexiconError(file, f"more than {MAX_LEXEMES} lexemes", line=child.line,
                                   column=child.column)  # fmt: skip
            lexeme = _lexeme(child, alphabet, file, symbols)
            graphemes += len(lexeme.graphemes)
            if graphemes > MAX_GRAPHEMES:
                raise LexiconError(file, f"more than {MAX_GRAPHEMES} graphemes",
                                   line=child.line, column=child.column)  # fmt: skip
            entries.append(lexeme)
        elif local not in _IGNORED:
            raise LexiconError(file, f"<{local}> is not a PLS 1.0 element of a <lexicon>",
                               line=child.line, column=child.column)  # fmt: skip
    try:
        return Lexicon(name, lang, tuple(entries))
    except (re.error, RecursionError) as exc:  # not expected within the caps; never a crash
        raise LexiconError(file, f"its graphemes do not compile ({exc})") from exc


def load_lexicon(
    path: Path, *, name: str | None = None, symbols: Collection[str] | None = None
) -> Lexicon:
    """Read and parse the PLS file at ``path`` (blocking: run in a thread). Never reads more
    than the cap, whatever the file's size."""
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise LexiconError(path.name, f"cannot be read ({exc.strerror or exc})") from exc
    return parse_lexicon(data, path.name, name=name, symbols=symbols)
