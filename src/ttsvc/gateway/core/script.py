"""What a request asks the worker to say: its SSML read into a script, the lexicons applied.

In the gateway, before any worker is picked, so that every refusal (malformed or unsafe SSML, a
phoneme the voice lacks, an unknown lexicon) is a 422 that touches no worker and costs no slot.
A plain text request that no lexicon changes sends no script at all: the worker reads its text
as it always did, and nothing here costs it more than a lookup.
"""

from __future__ import annotations

import asyncio
import unicodedata
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from ttsvc.errors import (
    InvalidParameter,
    InvalidSsml,
    NothingToSay,
    TextTooLong,
    UnknownLexicon,
)
from ttsvc.gateway.core.order import SpeechOrder
from ttsvc.protocol import Script, ScriptItem, ScriptRun, ScriptText
from ttsvc.text.lexicon import LexiconSet, Match
from ttsvc.text.ssml import parse_ssml
from ttsvc.voice import VoiceConfig

if TYPE_CHECKING:
    from ttsvc.gateway.core.state import GatewayState


async def compose(state: GatewayState, order: SpeechOrder) -> tuple[Script | None, str]:
    """The script ``order`` makes (``None``: plain text, read as it is) and its spoken text.

    A request admission refuses anyway (draining, over the cap, empty) is left for it to
    refuse, unread. The voices' configs are read here (cached); the parse and the lexicon scan,
    which grow with the text and the lexicons, run off the event loop."""
    field = "input" if order.api == "openai" else "text"
    lexicons = state.lexicons.current if state.lexicons is not None else LexiconSet()
    if not order.ssml and not order.lexicons and not len(lexicons):
        return None, order.text
    if state.draining or len(order.text) > state.settings.max_text_chars \
            or not order.text.strip():  # fmt: skip
        return None, order.text
    missing = [n for n in order.lexicons or () if n not in lexicons]
    if missing:
        known = ", ".join(sorted(lexicons.lexicons)) or "none"
        raise UnknownLexicon(f"no lexicon named {missing[0]!r} is loaded (loaded: {known})",
                             field="lexicons")  # fmt: skip
    configs = {order.voice: await _config(state, order.voice)}
    if order.ssml and "<voice" in order.text:  # the others' phoneme symbols, for their runs
        served = list(state.catalog.swappers) if state.catalog is not None else []
        configs |= {name: await _config(state, name) for name in served}
    script, spoken = await asyncio.to_thread(_script, state, order, lexicons, configs)
    if script is not None and order.ssml:
        if not any(isinstance(i, ScriptRun) for i in script):
            raise NothingToSay(f"{field} has nothing to speak (only markup and breaks)",
                               field=field)  # fmt: skip
        if order.timestamps:  # every voice the stream speaks in must have durations
            for voice in {i.voice for i in script if isinstance(i, ScriptRun) and i.voice}:
                state.require_durations(voice)
    return script, spoken


def _script(
    state: GatewayState,
    order: SpeechOrder,
    lexicons: LexiconSet,
    configs: dict[str, VoiceConfig | None],
) -> tuple[Script | None, str]:
    """``compose``'s work that grows with the text (in a thread): parse, apply, check."""
    field = "input" if order.api == "openai" else "text"

    def symbols(voice: str | None) -> frozenset[str] | None:
        found = configs.get(voice or order.voice)
        return None if found is None else frozenset(found.phoneme_id_map)

    if order.ssml:

        def voice_of(name: str) -> str | None:
            target = state.aliases.get(name, name)
            if target == order.voice:
                return None
            return target if configs.get(target) is not None else ""

        try:
            # fragment: ElevenLabs' SSML is text with inline tags; every other API marks as
            # SSML only what starts like a document, which reads as itself
            parsed = parse_ssml(order.text, unknown=state.settings.ssml_unknown_elements,
                                symbols=symbols, voice_of=voice_of,
                                max_phonemes=state.settings.max_sentence_chars,
                                fragment=True)  # fmt: skip
        except InvalidSsml as exc:
            raise InvalidSsml(exc.message, line=exc.line, column=exc.column, field=field) from exc
        script, spoken = parsed.script, parsed.text
        named = order.lexicons if order.lexicons is not None else (parsed.lexicons or None)
        missing = [n for n in named or () if n not in lexicons]
        if missing:
            raise UnknownLexicon(f"no lexicon named {missing[0]!r} is loaded", field="lexicons")
    else:
        script = (ScriptRun((ScriptText(order.text, (0, len(order.text))),)),)
        spoken, named = order.text, order.lexicons
    config = configs.get(order.voice)
    if named is not None:
        names = named
    else:  # unnamed: those of the voice's language
        names = () if config is None else lexicons.for_language(config.espeak_voice)
    if not names:
        return (script if order.ssml else None), spoken
    applied = apply_lexicons(script, lexicons, names)
    limit = state.settings.max_text_chars
    if len(order.text) + _grown(applied) - _grown(script) > limit:
        raise TextTooLong(f"{field} is over {limit} characters (max_text_chars) with its lexicon "
                          "pronunciations counted a character a symbol", field=field)  # fmt: skip
    if not order.ssml and applied == script:
        return None, spoken  # no word of the text is in them: read as plain text
    for item in applied:  # a lexicon's pronunciation, in the voice that says it
        if not isinstance(item, ScriptRun) or (known := symbols(item.voice)) is None:
            continue
        for piece in item.pieces:
            lacking = sorted({ch for ch in unicodedata.normalize("NFD", piece.phonemes or "")
                              if not ch.isspace() and ch not in known})  # fmt: skip
            if lacking:
                raise InvalidParameter(
                    f"the lexicon pronunciation of {piece.text!r} has symbols voice "
                    f"{item.voice or order.voice!r} does not have: "
                    + " ".join(f"{ch!r} (U+{ord(ch):04X})" for ch in lacking), field="lexicons")
    return applied, spoken


def _grown(script: Script) -> int:
    """How many more characters ``script``'s phoneme pieces count as than the words they name.

    Why: a lexicon's pronunciation is said instead of its word, so a text of words a lexicon
    spells out long must count against the text cap as what the acoustic model will read (an
    SSML ``phoneme``'s symbols are in the document already, and counted with it)."""
    return sum(max(0, p.size - len(p.text)) for item in script if isinstance(item, ScriptRun)
               for p in item.pieces if p.phonemes is not None)  # fmt: skip


def apply_lexicons(script: Script, lexicons: LexiconSet, names: Sequence[str]) -> Script:
    """``script`` with the named lexicons applied to the document's own words (not to what a
    ``sub`` or ``say-as`` wrote, nor inside a ``phoneme``): a match with an alias is read as
    the alias, one with a pronunciation said by its symbols; each keeps the span of the words it
    replaced. ``UnknownLexicon`` for a name that is not loaded."""
    out: list[ScriptItem] = []
    for item in script:
        if not isinstance(item, ScriptRun):
            out.append(item)
            continue
        pieces: list[ScriptText] = []
        for piece in item.pieces:
            if piece.phonemes is not None or not piece.verbatim:
                pieces.append(piece)
                continue
            pieces.extend(_rewritten(piece, lexicons.find(piece.text, names)))
        out.append(replace(item, pieces=tuple(pieces)))
    return tuple(out)


def _rewritten(piece: ScriptText, matches: list[Match]) -> list[ScriptText]:
    """``piece`` cut at ``matches``: the text between them as it was, each match rewritten."""
    if not matches:
        return [piece]
    base = piece.source[0]
    out: list[ScriptText] = []
    cursor = 0
    for match in matches:
        if match.start > cursor:
            out.append(ScriptText(piece.text[cursor:match.start],
                                  (base + cursor, base + match.start)))  # fmt: skip
        span = (base + match.start, base + match.end)
        lexeme, written = match.lexeme, piece.text[match.start:match.end]
        if lexeme.phoneme is not None:
            out.append(ScriptText(written, span, verbatim=False, phonemes=lexeme.phoneme))
        else:
            out.append(ScriptText(f" {lexeme.alias} ", span, verbatim=False))
        cursor = match.end
    if cursor < len(piece.text):
        out.append(ScriptText(piece.text[cursor:], (base + cursor, piece.source[1])))
    return out


async def _config(state: GatewayState, voice: str) -> VoiceConfig | None:
    """The Piper config of the voice's served version (its phoneme symbols, its language)."""
    swapper = state.catalog.get(voice) if state.catalog is not None else None
    if swapper is None or swapper.current is None:
        return None
    return VoiceConfig.from_piper(await state.voice_config(swapper.current), voice)
