"""What a request asks the worker to say, in process on the scripted pool: SSML read into a
script and lexicons applied in the gateway, every refusal before any worker is asked."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from tests.gateway.core.conftest import Core, chunk, order
from ttsvc.errors import (
    InvalidParameter,
    InvalidSsml,
    NothingToSay,
    TextTooLong,
    UnknownLexicon,
)
from ttsvc.gateway.core import script
from ttsvc.gateway.core.caller import Caller
from ttsvc.gateway.core.exchange import start_exchange
from ttsvc.gateway.core.order import SpeechOrder
from ttsvc.lifecycle.lexicons import LexiconStore
from ttsvc.protocol import ScriptBreak, ScriptRun, SynthesisJob
from ttsvc.voice import VoiceConfig

PLS = """<?xml version="1.0" encoding="UTF-8"?>
<lexicon version="1.0" xmlns="http://www.w3.org/2005/01/pronunciation-lexicon"
         alphabet="ipa" xml:lang="en-US">
  <lexeme><grapheme>ttsvc</grapheme><alias>tee tee ess vee see</alias></lexeme>
  <lexeme><grapheme>Acme</grapheme><phoneme>ˈækmi</phoneme></lexeme>
</lexicon>
"""


def dispatch(core: Core, speech: SpeechOrder) -> SynthesisJob:
    """Start ``speech`` and return the job its worker got (answered, so the exchange starts)."""

    async def go() -> SynthesisJob:
        started = asyncio.ensure_future(start_exchange(core.state, speech, Caller()))
        job = await core.dispatched()
        core.say(chunk(job.uid, b"\0\0"))
        exchange, _ = await started
        exchange.release_encoder()
        return job

    return core.run(go())


def refused(core: Core, speech: SpeechOrder) -> Exception:
    with pytest.raises(Exception) as caught:
        core.run(start_exchange(core.state, speech, Caller()))
    assert core.sent() == []  # no worker was asked
    return caught.value


@pytest.fixture(autouse=True)
def room_for_markup(core: Core) -> None:
    """The core's text cap (40) is set for its own tests; markup needs more."""
    core.state.settings = core.settings.model_copy(update={"max_text_chars": 1000})


@pytest.fixture
def lexicons(core: Core, tmp_path: Path) -> LexiconStore:
    (tmp_path / "lexicons").mkdir()
    (tmp_path / "lexicons" / "brands.pls").write_text(PLS, encoding="utf-8")
    store = LexiconStore(tmp_path)
    store.reload()
    core.state.lexicons = store
    return store


def test_plain_text_sends_no_script(core: Core) -> None:
    core.ready()
    job = dispatch(core, order("Hello there."))
    assert job.script is None and job.text == "Hello there."


def test_ssml_travels_as_a_script_with_its_spoken_text(core: Core) -> None:
    core.ready()
    source = '<speak>Hello <break time="300ms"/>there.</speak>'
    job = dispatch(core, dataclasses.replace(order(source), ssml=True))
    assert job.script is not None
    assert [type(i) for i in job.script] == [ScriptRun, ScriptBreak, ScriptRun]
    assert job.text == "Hello there."


def test_ssml_with_inline_tags_and_no_root_travels_with_spans_in_the_text_sent(
    core: Core,
) -> None:
    """ElevenLabs' ``enable_ssml_parsing`` marks text with inline tags as SSML (the only API
    whose SSML has no ``<speak>``): read as inside one, its word spans index the text sent, for
    the alignment ElevenLabs' clients read."""
    core.ready()
    source = 'Hello <break time="300ms"/>there.'
    job = dispatch(core, dataclasses.replace(order(source, api="elevenlabs"), ssml=True))
    assert job.script is not None
    first, pause, second = job.script
    assert pause == ScriptBreak(0.3) and job.text == "Hello there."
    assert isinstance(first, ScriptRun) and isinstance(second, ScriptRun)
    assert [source[slice(*p.source)] for p in (*first.pieces, *second.pieces)] == ["Hello ",
                                                                                 "there."]


@pytest.mark.parametrize("api,field", [("synthesize", "text"), ("openai", "input")])
def test_bad_ssml_touches_no_worker(core: Core, api: str, field: str) -> None:
    core.ready()
    speech = dataclasses.replace(order("<speak><s>x</speak>", api=api), ssml=True)
    error = refused(core, speech)
    assert isinstance(error, InvalidSsml) and error.field == field
    assert "line 1" in error.message


def test_a_named_lexicon_rewrites_the_words_it_has(core: Core, lexicons: LexiconStore) -> None:
    core.ready()
    text = "Acme runs ttsvc."
    job = dispatch(core, dataclasses.replace(order(text), lexicons=("brands",)))
    assert job.script is not None and job.text == text
    (run,) = job.script
    assert isinstance(run, ScriptRun)
    acme = next(p for p in run.pieces if p.phonemes)
    alias = next(p for p in run.pieces if "tee" in p.text)
    assert (acme.phonemes, text[acme.source[0] : acme.source[1]]) == ("ˈækmi", "Acme")
    assert text[alias.source[0] : alias.source[1]] == "ttsvc"


def test_text_no_lexicon_changes_stays_plain(core: Core, lexicons: LexiconStore) -> None:
    core.ready()
    job = dispatch(core, dataclasses.replace(order("Nothing here."), lexicons=("brands",)))
    assert job.script is None


def test_an_unknown_lexicon_touches_no_worker(core: Core, lexicons: LexiconStore) -> None:
    core.ready()
    error = refused(core, dataclasses.replace(order("Hi."), lexicons=("nope",)))
    assert isinstance(error, UnknownLexicon) and error.status == 422
    ssml = '<speak><lexicon uri="nope"/>Hi.</speak>'
    assert isinstance(refused(core, dataclasses.replace(order(ssml), ssml=True)), UnknownLexicon)


def test_lexicons_apply_inside_ssml_but_not_to_what_markup_wrote(
    core: Core, lexicons: LexiconStore
) -> None:
    core.ready()
    source = (
        '<speak><lexicon uri="brands"/>Acme and <sub alias="Acme">ACME</sub> '
        '<say-as interpret-as="characters">ttsvc</say-as></speak>'
    )
    job = dispatch(core, dataclasses.replace(order(source), ssml=True))
    assert job.script is not None
    (run,) = job.script
    assert isinstance(run, ScriptRun)
    assert [p.phonemes for p in run.pieces if p.phonemes] == ["ˈækmi"]  # the first Acme only
    assert any(p.text.strip() == "T T S V C" for p in run.pieces)


def test_a_document_with_nothing_to_say_touches_no_worker(core: Core) -> None:
    """Asked as the error (``empty_text: "error"``); the default silence is the exchange's
    (tests/gateway/core/test_exchange.py)."""
    core.ready()
    speech = order('<speak><break time="1s"/></speak>', ssml=True, empty_text="error")
    error = refused(core, speech)
    assert isinstance(error, NothingToSay) and error.field == "text"


def test_a_named_lexicon_is_checked_even_with_no_text_to_scan(
    core: Core, lexicons: LexiconStore
) -> None:
    core.ready()
    speech = dataclasses.replace(order('<speak><sub alias="x">y</sub></speak>'), ssml=True,
                                 lexicons=("nope",))  # fmt: skip
    assert isinstance(refused(core, speech), UnknownLexicon)


def test_lexicon_matches_span_line_breaks_in_a_document(
    core: Core, lexicons: LexiconStore, tmp_path: Path
) -> None:
    core.ready()
    (tmp_path / "lexicons" / "places.pls").write_text(PLS.replace(
        "<lexeme><grapheme>ttsvc</grapheme>", "<lexeme><grapheme>New York</grapheme>"),
        encoding="utf-8")  # fmt: skip
    lexicons.reload()
    source = "<speak>From New\nYork.</speak>"
    job = dispatch(core, dataclasses.replace(order(source), ssml=True, lexicons=("places",)))
    assert job.script is not None
    (run,) = job.script
    assert isinstance(run, ScriptRun)
    alias = next(p for p in run.pieces if not p.verbatim)
    assert source[alias.source[0]:alias.source[1]] == "New\nYork"


def test_a_lexicon_pronunciation_the_voice_cannot_say_is_refused(
    core: Core, lexicons: LexiconStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scripted core has no voice config; one is given here with a small symbol set."""
    config = VoiceConfig(sample_rate=22050, espeak_voice="en-us",
                         phoneme_id_map={"_": [0], "^": [1], "$": [2], "a": [3]})  # fmt: skip

    async def only_a(_state: object, _voice: str) -> VoiceConfig:
        return config

    monkeypatch.setattr(script, "_config", only_a)
    core.ready()
    error = refused(core, dataclasses.replace(order("Acme here."), lexicons=("brands",)))
    assert isinstance(error, InvalidParameter) and error.field == "lexicons"
    assert "U+00E6" in error.message


def test_a_phoneme_longer_than_a_sentence_touches_no_worker(core: Core) -> None:
    """The acoustic model reads a sentence at once: thousands of symbols under one word
    exhausted ONNX Runtime's memory inside a worker that serves other streams."""
    core.ready()
    limit = core.state.settings.max_sentence_chars
    said = "<speak><phoneme ph='{}'>x</phoneme></speak>"
    dispatch(core, dataclasses.replace(order(said.format("ə" * limit)), ssml=True))
    error = refused(core, dataclasses.replace(order(said.format("ə" * (limit + 1))), ssml=True))
    assert isinstance(error, InvalidSsml) and error.field == "text"
    assert f"{limit + 1} symbols, more than the {limit}" in error.message


def test_pronunciations_count_against_the_text_cap(core: Core, tmp_path: Path) -> None:
    """A lexicon's pronunciation is said instead of its word: its symbols count as the text
    they stand for, so a short text of words a lexicon spells out long is refused."""
    (tmp_path / "lexicons").mkdir()
    (tmp_path / "lexicons" / "long.pls").write_text(PLS.replace("ˈækmi", "ˈækmi" * 10))
    store = LexiconStore(tmp_path)
    store.reload()
    core.state.lexicons = store
    core.ready()
    cap = core.state.settings.max_text_chars
    fits = "Acme " * (cap // 50 - 1)  # 50 symbols each
    dispatch(core, dataclasses.replace(order(fits), lexicons=("long",)))
    over = "Acme " * (cap // 50 + 1)
    error = refused(core, dataclasses.replace(order(over), lexicons=("long",)))
    assert isinstance(error, TextTooLong) and error.field == "text"
    assert f"over {cap} characters (max_text_chars)" in error.message
