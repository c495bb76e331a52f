"""SSML to a ``Script``: what to say, with rates, volumes, pauses and marks, each piece of text
with its span in the document the client sent.

The subset the large services share (Polly, Azure, Google): ``speak``, ``p``, ``s``, ``break``,
``prosody`` (``rate``, ``volume``), ``say-as``, ``sub``, ``phoneme``, ``emphasis`` (spoken as
plain text), ``mark``, ``lexicon``, ``voice`` (any served voice, mid-request). Anything else is
refused with its line and column, or (``unknown="ignore"``) spoken as its text.

Safe by construction: the document is read by ``defusedxml`` first (no DTD, so no entity
expansion and no external reference can happen), then walked with expat for the source offsets
ElementTree does not keep; depth, element count and break time are capped before any worker is
involved. Markup never reaches espeak-ng: only the text between tags (and the ``sub`` aliases
and ``say-as`` words made from it) is read, through the same normalization as plain text.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Literal
from xml.etree.ElementTree import ParseError
from xml.parsers import expat

import defusedxml
import defusedxml.ElementTree

from ttsvc.errors import InvalidSsml
from ttsvc.protocol import Script, ScriptBreak, ScriptItem, ScriptMark, ScriptRun, ScriptText
from ttsvc.text.say_as import say_as
from ttsvc.voice import NAME_RE

__all__ = ["BREAK_STRENGTHS", "MAX_BREAK_S", "MAX_DEPTH", "MAX_ELEMENTS", "Parsed", "is_ssml",
           "parse_ssml"]  # fmt: skip

MAX_DEPTH = 32
"""Deepest nesting accepted: real documents nest a handful of levels."""
MAX_ELEMENTS = 2000
"""Most elements in one document: a mark per word of a long text fits."""
MAX_BREAK_S = 10.0
"""Longest single break (Polly's and Azure's cap)."""
MAX_TOTAL_BREAK_S = 60.0
"""Most break time in one document: past it, a request is mostly silence."""

BREAK_STRENGTHS = {"none": 0.0, "x-weak": 0.25, "weak": 0.5, "medium": 0.75, "strong": 1.0,
                   "x-strong": 1.25}  # fmt: skip
"""Seconds per ``break strength`` (Azure's values; a ``break`` with neither attribute is
``medium``)."""
RATES = {"x-slow": 0.5, "slow": 0.64, "medium": 1.0, "default": 1.0, "fast": 1.55, "x-fast": 2.0}
"""``prosody rate`` names as speed multipliers (Azure's values)."""
VOLUMES_DB = {"silent": None, "x-soft": -12.0, "soft": -6.0, "medium": 0.0, "default": 0.0,
              "loud": 6.0, "x-loud": 12.0}  # fmt: skip
"""``prosody volume`` names in dB (``silent`` mutes)."""
_RATE_RANGE = (0.25, 4.0)
_DB_RANGE = (-40.0, 12.0)
_NAME_RE = NAME_RE
"""A voice or lexicon name: never a path (the engines directory's own rule)."""
_MARK_RE = re.compile(r"[^\s<>&\"]{1,64}")
_TIME_RE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s)\s*")
_SSML_START_RE = re.compile(r"\s*(?:<\?xml[^>]*\?>\s*)?(?:<speak[\s>/]|<!DOCTYPE|<!--)")

Unknown = Literal["reject", "ignore"]


def is_ssml(text: str) -> bool:
    """Whether ``text`` is an SSML document: it starts with ``<speak`` (an XML declaration
    before it allowed), or with a DTD or a comment, which only XML starts with (read as XML,
    a DTD is then refused rather than spoken)."""
    return _SSML_START_RE.match(text) is not None


_SSML_OPENINGS = ("<speak", "<?xml", "<!")
"""What a document's first characters are (``is_ssml``), for text still coming in."""


def may_be_ssml(text: str) -> bool:
    """Whether ``text``, the start of a text still arriving, can still become an SSML document:
    it is (or begins like) one of ``<speak``, ``<?xml``, ``<!``. A stream that cannot (``<3``)
    is plain text and need not be held to its end."""
    start = text.lstrip()
    return any(start[: len(m)] == m[: len(start)] for m in _SSML_OPENINGS)


@dataclass(frozen=True)
class Parsed:
    """A parsed document: what to say and what it asked for beside."""

    script: Script
    text: str
    """Its spoken text, pieces joined (for estimates and logs)."""
    lexicons: tuple[str, ...] = ()
    """Lexicons the document names (``<lexicon uri="name"/>``), in order."""


@dataclass
class _Node:
    tag: str
    attrs: dict[str, str]
    line: int
    column: int
    start: int
    """Offset of its start tag in the document."""
    children: list[_Node | ScriptText] = field(default_factory=list)


def _offsets(raw: bytes) -> list[int]:
    """Character offset of every byte offset of UTF-8 ``raw`` (expat counts bytes)."""
    out = [0] * (len(raw) + 1)
    chars = 0
    for i, byte in enumerate(raw):
        if byte & 0xC0 != 0x80:  # not a continuation byte: a character starts here
            chars += 1
        out[i] = chars - 1
    out[len(raw)] = chars
    return out


FRAGMENT_ROOT = "<speak>"
"""What text with inline markup is read inside (``parse_ssml``'s ``fragment``)."""


def _read(source: str, lead: int = 0) -> _Node:
    """The document as a tree of elements and text pieces with their source spans.

    ``lead``: characters the caller put before the client's text (a ``<speak>`` around a
    fragment), left out of every offset and of the columns of the first line, so that spans and
    positions point into what the client sent."""

    def column_at(line: int, column: int) -> int:
        return max(1, column - lead) if line == 1 else column

    try:
        raw = source.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate from a JSON string
        raise InvalidSsml(f"SSML has a character that is not Unicode text at offset "
                          f"{max(0, exc.start - lead)}", line=0, column=0) from exc  # fmt: skip
    try:
        defusedxml.ElementTree.fromstring(source, forbid_dtd=True)
    except ParseError as exc:
        line, column = exc.position
        column = column_at(line, column + 1) - 1
        reason = str(exc).split(":")[0]
        raise InvalidSsml(f"SSML is not well-formed XML at line {line}, column {column + 1}: "
                          f"{reason}", line=line, column=column + 1) from exc  # fmt: skip
    except defusedxml.DefusedXmlException as exc:
        raise InvalidSsml(f"SSML may not have a DTD, entities or external references "
                          f"({type(exc).__name__})", line=1, column=1) from exc  # fmt: skip
    offsets = [max(0, offset - lead) for offset in _offsets(raw)]
    # the bytes are UTF-8 whatever an XML declaration says (the text came as a JSON string)
    parser = expat.ParserCreate(encoding="UTF-8")
    parser.buffer_text = False
    root: list[_Node] = []
    stack: list[_Node] = []
    count = 0
    cdata = False

    def start(tag: str, attrs: dict[str, str]) -> None:
        nonlocal count
        line = parser.CurrentLineNumber
        column = column_at(line, parser.CurrentColumnNumber + 1)
        count += 1
        if len(stack) >= MAX_DEPTH:
            raise InvalidSsml(f"SSML nests deeper than {MAX_DEPTH} elements at line {line}, "
                              f"column {column}", line=line, column=column)  # fmt: skip
        if count > MAX_ELEMENTS:
            raise InvalidSsml(f"SSML has more than {MAX_ELEMENTS} elements (at line {line}, "
                              f"column {column})", line=line, column=column)  # fmt: skip
        node = _Node(tag, attrs, line, column, offsets[parser.CurrentByteIndex])
        if stack:
            stack[-1].children.append(node)
        else:
            root.append(node)
        stack.append(node)

    def end(_tag: str) -> None:
        stack.pop()

    def text(data: str) -> None:
        if not stack:
            return
        at = parser.CurrentByteIndex
        encoded = data.encode("utf-8")
        verbatim = False
        if not cdata and raw.startswith(b"&", at):  # a reference: "&" is never literal text
            stop = raw.index(b";", at) + 1
        elif raw.startswith(encoded, at):
            stop, verbatim = at + len(encoded), True
        elif raw.startswith(b"\r\n", at):
            stop = at + 2
        else:
            stop = at + len(encoded)
        piece = ScriptText(data, (offsets[at], offsets[stop]), verbatim)
        siblings = stack[-1].children
        last = siblings[-1] if siblings else None
        if (verbatim and isinstance(last, ScriptText) and last.verbatim
                and last.source[1] == piece.source[0]):  # fmt: skip
            # one piece for text expat reports line by line: a lexicon's "New York" may span
            # the line break
            siblings[-1] = ScriptText(last.text + data, (last.source[0], piece.source[1]))
        else:
            siblings.append(piece)

    def cdata_start() -> None:
        nonlocal cdata
        cdata = True

    def cdata_end() -> None:
        nonlocal cdata
        cdata = False

    parser.StartCdataSectionHandler = cdata_start
    parser.EndCdataSectionHandler = cdata_end
    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = text
    try:
        parser.Parse(raw, True)
    except expat.ExpatError as exc:  # the gate read it: only what differs in expat gets here
        column = column_at(exc.lineno, exc.offset + 1)
        raise InvalidSsml(f"SSML is not well-formed XML at line {exc.lineno}, column "
                          f"{column}: {expat.ErrorString(exc.code)}",
                          line=exc.lineno, column=column) from exc  # fmt: skip
    return root[0]


def _content(node: _Node) -> list[ScriptText]:
    """The text pieces directly inside ``node``; a child element is refused (``say-as``,
    ``sub`` and ``phoneme`` hold text only)."""
    pieces = []
    for child in node.children:
        if isinstance(child, _Node):
            raise _refuse(child, f"<{child.tag}> may not be inside <{node.tag}>")
        pieces.append(child)
    return pieces


def _refuse(node: _Node, reason: str) -> InvalidSsml:
    return InvalidSsml(f"SSML line {node.line}, column {node.column}: {reason}",
                       line=node.line, column=node.column)  # fmt: skip


def _seconds(node: _Node) -> float:
    time = node.attrs.get("time")
    if time is not None:
        match = _TIME_RE.fullmatch(time)
        if match is None:
            raise _refuse(node, f"break time {time!r} is not a duration like 700ms or 1.5s")
        seconds = float(match[1]) / (1000.0 if match[2] == "ms" else 1.0)
        if seconds > MAX_BREAK_S:
            raise _refuse(node, f"break time {time!r} is over the {MAX_BREAK_S:g} s a break may "
                          "last")  # fmt: skip
        return seconds
    strength = node.attrs.get("strength", "medium")
    if strength not in BREAK_STRENGTHS:
        raise _refuse(node, f"break strength {strength!r} is not one of "
                      f"{', '.join(BREAK_STRENGTHS)}")  # fmt: skip
    return BREAK_STRENGTHS[strength]


def _rate(node: _Node, value: str) -> float:
    """A ``prosody rate``: a name, a multiplier ("1.5"), a percentage of the normal rate ("150%",
    Polly) or a relative change ("+20%", "-10%", Azure)."""
    value = value.strip()
    if value in RATES:
        return RATES[value]
    match = re.fullmatch(r"([+-]?)([0-9]+(?:\.[0-9]+)?)(%?)", value)
    if match is None:
        raise _refuse(node, f"prosody rate {value!r} is not a name ({', '.join(RATES)}), a "
                      "multiplier or a percentage")  # fmt: skip
    sign, number, percent = match.groups()
    amount = float(number)
    if percent and sign:
        rate = 1.0 + (amount if sign == "+" else -amount) / 100.0
    elif percent:
        rate = amount / 100.0
    else:
        rate = amount if not sign else 1.0 + (amount if sign == "+" else -amount)
    low, high = _RATE_RANGE
    if not low <= rate <= high:
        raise _refuse(node, f"prosody rate {value!r} is outside {low:g}x to {high:g}x")
    return rate


def _gain(node: _Node, value: str) -> float:
    """A ``prosody volume`` as a linear gain: a name or a change in dB ("+6dB", "-3dB")."""
    value = value.strip()
    if value in VOLUMES_DB:
        db = VOLUMES_DB[value]
        return 0.0 if db is None else 10 ** (db / 20)
    match = re.fullmatch(r"([+-]?[0-9]+(?:\.[0-9]+)?)\s*dB", value)
    if match is None:
        raise _refuse(node, f"prosody volume {value!r} is not a name ({', '.join(VOLUMES_DB)}) "
                      "or a change in dB like +6dB")  # fmt: skip
    db = float(match[1])
    low, high = _DB_RANGE
    if not low <= db <= high:
        raise _refuse(node, f"prosody volume {value!r} is outside {low:g} dB to +{high:g} dB")
    return 10 ** (db / 20)


def _name(node: _Node, attr: str, pattern: re.Pattern[str] = _NAME_RE) -> str:
    value = node.attrs.get(attr)
    if value is None:
        raise _refuse(node, f"<{node.tag}> needs a {attr} attribute")
    if pattern.fullmatch(value) is None:
        raise _refuse(node, f"{node.tag} {attr} {value!r} is not a name (letters, digits, "
                      "'.', '_', '-'; no paths)")  # fmt: skip
    return value


class _Builder:
    """Walks the tree, keeping the current rate and gain, into runs, breaks and marks."""

    def __init__(
        self,
        symbols: Callable[[str | None], Collection[str] | None],
        unknown: Unknown,
        voice_of: Callable[[str], str | None],
        max_phonemes: int | None = None,
    ) -> None:
        self.symbols = symbols
        self.max_phonemes = max_phonemes
        self.unknown = unknown
        self.voice_of = voice_of
        self.voice: str | None = None
        self.items: list[ScriptItem] = []
        self.pieces: list[ScriptText] = []
        self.marks: list[tuple[str, int]] = []
        self.pending: list[tuple[str, int]] = []
        self.rate, self.gain = 1.0, 1.0
        self.lexicons: list[str] = []
        self.break_s = 0.0

    def piece(self, piece: ScriptText) -> None:
        if not self.pieces:
            self.marks, self.pending = self.pending, []
        self.pieces.append(piece)

    def flush(self) -> None:
        """End the current run (a whitespace-only run is dropped, its marks kept for the
        next)."""
        pieces, self.pieces = self.pieces, []
        if not any(p.phonemes or p.text.strip() for p in pieces):
            self.pending = self.marks + self.pending
            self.marks = []
            return
        self.items.append(ScriptRun(tuple(pieces), self.rate, self.gain, tuple(self.marks),
                                    self.voice))  # fmt: skip
        self.marks = []

    def pause(self, seconds: float | None) -> None:
        self.flush()
        if seconds is not None:
            self.break_s += seconds
            if self.break_s > MAX_TOTAL_BREAK_S:
                raise InvalidSsml(f"SSML asks for more than {MAX_TOTAL_BREAK_S:g} s of breaks",
                                  line=0, column=0)  # fmt: skip
        if not self.items:
            if seconds:
                self.items.append(ScriptBreak(seconds))
            return
        if seconds is None:
            for item in reversed(self.items):
                if not isinstance(item, ScriptBreak):
                    break
                if item.seconds is None:
                    return  # one boundary between two runs is one sentence pause
        self.items.append(ScriptBreak(seconds))

    def walk(self, node: _Node) -> None:
        handler = _ELEMENTS.get(node.tag)
        if handler is None:
            if self.unknown == "reject":
                raise _refuse(node, f"<{node.tag}> is not an SSML element ttsvc speaks")
            self.children(node)
            return
        handler(self, node)

    def children(self, node: _Node) -> None:
        for child in node.children:
            if isinstance(child, ScriptText):
                self.piece(child)
            else:
                self.walk(child)

    def finish(self) -> Script:
        self.flush()
        while self.items and isinstance(self.items[-1], ScriptBreak) \
                and self.items[-1].seconds is None:  # fmt: skip
            self.items.pop()
        self.items.extend(ScriptMark(name, at) for name, at in self.pending)
        return tuple(self.items)

    # --- elements ---

    def _speak(self, node: _Node) -> None:
        self.children(node)

    def _p(self, node: _Node) -> None:
        self.pause(None)
        self.children(node)
        self.pause(None)


    def _break(self, node: _Node) -> None:
        seconds = _seconds(node)
        if seconds > 0:
            self.pause(seconds)

    def _prosody(self, node: _Node) -> None:
        for attr in ("pitch", "contour", "range"):
            if attr in node.attrs and node.attrs[attr].strip() not in ("default", "medium", "+0%",
                                                                       "0%", "+0st"):
                raise _refuse(node, f"prosody {attr} is not supported: the voice has no pitch "
                              "control (rate and volume are)")  # fmt: skip
        rate = self.rate * (_rate(node, node.attrs["rate"]) if "rate" in node.attrs else 1.0)
        gain = self.gain * (_gain(node, node.attrs["volume"]) if "volume" in node.attrs else 1.0)
        gain = min(gain, 10 ** (_DB_RANGE[1] / 20))  # nested volumes: never past +12 dB
        if "duration" in node.attrs:
            raise _refuse(node, "prosody duration is not supported (use rate)")
        saved = self.rate, self.gain
        if (rate, gain) != saved:
            self.flush()
        self.rate, self.gain = rate, gain
        self.children(node)
        if (rate, gain) != saved:
            self.flush()
        self.rate, self.gain = saved

    def _emphasis(self, node: _Node) -> None:
        level = node.attrs.get("level", "moderate")
        if level not in ("strong", "moderate", "none", "reduced"):
            raise _refuse(node, f"emphasis level {level!r} is not strong, moderate, none or "
                          "reduced")  # fmt: skip
        self.children(node)

    def _say_as(self, node: _Node) -> None:
        kind = node.attrs.get("interpret-as")
        if kind is None:
            raise _refuse(node, "<say-as> needs an interpret-as attribute")
        pieces = _content(node)
        content = "".join(p.text for p in pieces)
        try:
            words = say_as(kind, content, node.attrs.get("format"))
        except ValueError as exc:
            raise _refuse(node, f"say-as {kind}: {exc}") from exc
        self.piece(ScriptText(f" {words} ", _span(node, pieces), verbatim=False))

    def _sub(self, node: _Node) -> None:
        alias = node.attrs.get("alias")
        if alias is None:
            raise _refuse(node, "<sub> needs an alias attribute")
        self.piece(ScriptText(f" {alias} ", _span(node, _content(node)), verbatim=False))

    def _phoneme(self, node: _Node) -> None:
        alphabet = node.attrs.get("alphabet", "ipa")
        if alphabet != "ipa":
            raise _refuse(node, f"phoneme alphabet {alphabet!r} is not supported (ipa is)")
        ph = node.attrs.get("ph")
        if not ph or not ph.strip():
            raise _refuse(node, "<phoneme> needs a ph attribute")
        symbols = self.symbols(self.voice)
        if symbols is not None:
            missing = sorted({ch for ch in unicodedata.normalize("NFD", ph)
                              if not ch.isspace() and ch not in symbols})  # fmt: skip
            if missing:
                raise _refuse(node, "phoneme ph has symbols the voice does not have: "
                              + " ".join(f"{ch!r} (U+{ord(ch):04X})" for ch in missing))
        pieces = _content(node)
        said = ScriptText("".join(p.text for p in pieces).strip(), _span(node, pieces),
                          verbatim=False, phonemes=ph.strip())  # fmt: skip
        if self.max_phonemes is not None and said.size > self.max_phonemes:
            raise _refuse(node, f"phoneme ph has {said.size} symbols, more than the "
                          f"{self.max_phonemes} a sentence may hold (max_sentence_chars)")
        self.piece(said)

    def _mark(self, node: _Node) -> None:
        name = _name(node, "name", _MARK_RE)
        if self.pieces:
            self.marks.append((name, node.start))
        else:
            self.pending.append((name, node.start))

    def _lexicon(self, node: _Node) -> None:
        attr = "uri" if "uri" in node.attrs else "name"
        self.lexicons.append(_name(node, attr))

    def _voice(self, node: _Node) -> None:
        name = _name(node, "name")
        voice = self.voice_of(name)
        if voice == "":
            raise _refuse(node, f"voice {name!r} is not a voice this service serves (GET "
                          "/voices lists them)")  # fmt: skip
        if voice != self.voice:
            self.flush()
        saved, self.voice = self.voice, voice
        self.children(node)
        if voice != saved:
            self.flush()
        self.voice = saved


_ELEMENTS: dict[str, Callable[[_Builder, _Node], None]] = {
    "speak": _Builder._speak, "p": _Builder._p, "s": _Builder._p, "paragraph": _Builder._p,
    "sentence": _Builder._p, "break": _Builder._break, "prosody": _Builder._prosody,
    "emphasis": _Builder._emphasis, "say-as": _Builder._say_as, "sub": _Builder._sub,
    "phoneme": _Builder._phoneme, "mark": _Builder._mark, "lexicon": _Builder._lexicon,
    "voice": _Builder._voice,
}  # fmt: skip
"""The elements ttsvc speaks, by tag."""


def _span(node: _Node, pieces: list[ScriptText]) -> tuple[int, int]:
    if not pieces:
        return node.start, node.start
    return pieces[0].source[0], pieces[-1].source[1]


def parse_ssml(
    source: str,
    *,
    symbols: Collection[str] | Callable[[str | None], Collection[str] | None] | None = None,
    unknown: Unknown = "reject",
    voice_of: Callable[[str], str | None] = lambda _name: None,
    max_phonemes: int | None = None,
    fragment: bool = False,
) -> Parsed:
    """Read SSML ``source`` into a script; ``InvalidSsml`` (a 422 with line, column and reason)
    for anything malformed, unsafe, unknown (``unknown="reject"``) or out of range.

    ``symbols``: the phoneme symbols a ``phoneme`` element's ``ph`` must keep to, per voice
    (``None``: the request's voice) or one set for all; ``voice_of``: the served voice a
    ``voice`` element's name means, ``None`` for the request's own voice, ``""`` for none;
    ``max_phonemes``: the most symbols one ``phoneme`` may give (a sentence's length: the
    acoustic model reads a sentence at once, and one of thousands of symbols exhausts its
    memory); ``fragment``: ``source`` may also be text with inline markup and no root
    (ElevenLabs' SSML: ``Wait <break time="1s"/> now.``), read as if inside ``<speak>``,
    spans and positions still in ``source``."""
    if fragment and not is_ssml(source):
        root = _read(f"{FRAGMENT_ROOT}{source}</speak>", len(FRAGMENT_ROOT))
    else:
        root = _read(source)
    if root.tag != "speak":
        raise _refuse(root, f"the root element is <{root.tag}>, not <speak>")
    per_voice = symbols if callable(symbols) else (lambda _voice: symbols)
    builder = _Builder(per_voice, unknown, voice_of, max_phonemes)
    builder.walk(root)
    script = builder.finish()
    spoken = " ".join(p.text.strip() for item in script if isinstance(item, ScriptRun)
                      for p in item.pieces if p.text.strip())  # fmt: skip
    return Parsed(script, spoken, tuple(builder.lexicons))
