"""SSML to a script: each element's meaning, spans into the document, and every refusal (with
its line and column) before anything reaches a worker."""

from __future__ import annotations

import pytest

from ttsvc.errors import InvalidSsml
from ttsvc.protocol import ScriptBreak, ScriptMark, ScriptRun, ScriptText
from ttsvc.text.ssml import (
    BREAK_STRENGTHS,
    MAX_DEPTH,
    MAX_ELEMENTS,
    RATES,
    is_ssml,
    parse_ssml,
)


def runs(source: str, **kw: object) -> list[ScriptRun]:
    return [i for i in parse_ssml(source, **kw).script if isinstance(i, ScriptRun)]  # type: ignore[arg-type]


def said(run: ScriptRun) -> str:
    return "".join(p.text for p in run.pieces)


@pytest.mark.parametrize("text,expected", [
    ("<speak>Hi</speak>", True), ("  <speak version='1.0'>Hi</speak>", True),
    ('<?xml version="1.0"?><speak>Hi</speak>', True), ("<speak/>", True),
    ("<!DOCTYPE speak><speak/>", True), ("<!-- c --><speak/>", True),
    ("Hello <speak>", False), ("<speaker>Hi</speaker>", False), ("", False),
])  # fmt: skip
def test_is_ssml_by_its_start(text: str, expected: bool) -> None:
    assert is_ssml(text) is expected


def test_plain_text_pieces_point_into_the_document() -> None:
    source = "<speak>Fish &amp; chips, <![CDATA[a&b]]>\r\nplease.</speak>"
    (run,) = runs(source)
    for piece in run.pieces:
        text = source[piece.source[0] : piece.source[1]]
        if piece.verbatim:
            assert text == piece.text
    amp = next(p for p in run.pieces if p.text == "&")
    assert source[amp.source[0] : amp.source[1]] == "&amp;" and not amp.verbatim
    cdata = next(p for p in run.pieces if p.text == "a&b")
    assert cdata.verbatim and source[cdata.source[0] : cdata.source[1]] == "a&b"


def test_offsets_count_characters_not_bytes() -> None:
    source = "<speak>Café — naïve <mark name='x'/>word</speak>"
    script = parse_ssml(source).script
    (run,) = [i for i in script if isinstance(i, ScriptRun)]
    piece = run.pieces[-1]
    assert source[piece.source[0] : piece.source[1]] == "word"
    assert source[run.marks[0][1] :].startswith("<mark")


def test_break_time_and_strength() -> None:
    script = parse_ssml(
        '<speak>A <break time="700ms"/>B<break time="1.5s"/>C<break '
        'strength="x-strong"/>D<break/>E</speak>'
    ).script
    breaks = [i.seconds for i in script if isinstance(i, ScriptBreak)]
    assert breaks == [0.7, 1.5, BREAK_STRENGTHS["x-strong"], BREAK_STRENGTHS["medium"]]
    assert [said(r).strip() for r in runs('<speak>A <break strength="none"/>B</speak>')] == ["A B"]


def test_sentences_and_paragraphs_are_boundaries_not_breaks() -> None:
    script = parse_ssml("<speak><p><s>One.</s><s>Two.</s></p><p>Three.</p></speak>").script
    kinds = [type(i).__name__ if not isinstance(i, ScriptBreak) else i.seconds for i in script]
    assert kinds == ["ScriptRun", None, "ScriptRun", None, "ScriptRun"]


def test_a_break_beside_a_boundary_adds_to_its_pause() -> None:
    script = parse_ssml('<speak><s>One</s><break time="2s"/><s>Two</s></speak>').script
    assert [i.seconds for i in script if isinstance(i, ScriptBreak)] == [None, 2.0]


@pytest.mark.parametrize("declared", ["utf-16", "ISO-8859-1", "foo"])
def test_a_declared_encoding_is_not_obeyed(declared: str) -> None:
    """The document came as a JSON string: its characters are what they are, whatever an XML
    declaration (.NET's XmlWriter over a StringWriter writes utf-16) says."""
    source = f'<?xml version="1.0" encoding="{declared}"?><speak>Café au lait</speak>'
    (run,) = runs(source)
    assert said(run) == "Café au lait"
    assert source[run.pieces[0].source[0]:run.pieces[0].source[1]] == "Café au lait"


def test_text_that_is_not_unicode_is_refused() -> None:
    assert "not Unicode text" in refused("<speak>\ud800</speak>").message


def test_nested_volumes_stop_at_twelve_db() -> None:
    got = runs('<speak><prosody volume="x-loud"><prosody volume="x-loud">a</prosody>'
               "</prosody></speak>")
    assert got[0].gain == pytest.approx(10 ** (12 / 20))


def test_prosody_rate_and_volume_make_their_own_run() -> None:
    got = runs(
        '<speak>a <prosody rate="slow" volume="+6dB">b <prosody rate="200%">c'
        "</prosody></prosody> d</speak>"
    )
    assert [said(r).strip() for r in got] == ["a", "b", "c", "d"]
    assert [r.rate for r in got] == pytest.approx([1.0, RATES["slow"], RATES["slow"] * 2.0, 1.0])
    assert got[1].gain == pytest.approx(10 ** (6 / 20))
    assert got[2].gain == got[1].gain and got[3].gain == 1.0


@pytest.mark.parametrize("rate,expected", [
    ("x-slow", 0.5), ("x-fast", 2.0), ("1.5", 1.5), ("150%", 1.5), ("+20%", 1.2), ("-50%", 0.5),
])  # fmt: skip
def test_rate_forms(rate: str, expected: float) -> None:
    (_, run) = runs(f'<speak>a <prosody rate="{rate}">b</prosody></speak>')
    assert run.rate == pytest.approx(expected)


def test_silent_volume_mutes() -> None:
    assert runs('<speak><prosody volume="silent">hush</prosody></speak>')[0].gain == 0.0


def test_say_as_sub_and_phoneme_keep_the_span_of_what_they_replace() -> None:
    source = (
        '<speak>Call <say-as interpret-as="telephone">555-0123</say-as>, '
        '<sub alias="World Wide Web">WWW</sub> and <phoneme alphabet="ipa" ph="təmˈɑːtoʊ">'
        "tomato</phoneme>.</speak>"
    )
    (run,) = runs(source)
    rewritten = [p for p in run.pieces if not p.verbatim]
    assert [source[p.source[0] : p.source[1]] for p in rewritten] == ["555-0123", "WWW", "tomato"]
    assert rewritten[0].text.strip() == "five five five, zero one two three"
    assert rewritten[1].text.strip() == "World Wide Web"
    assert rewritten[2].phonemes == "təmˈɑːtoʊ" and rewritten[2].text == "tomato"


def test_marks_belong_to_the_run_they_are_in_or_follow_the_last() -> None:
    source = (
        '<speak><mark name="a"/>One <mark name="b"/>two.<break time="1s"/><mark name="c"/>'
        'Three.<mark name="d"/></speak><!-- end -->'
    )
    script = parse_ssml(source).script
    first, second = [i for i in script if isinstance(i, ScriptRun)]
    assert [name for name, _ in first.marks] == ["a", "b"]
    assert [name for name, _ in second.marks] == ["c", "d"]
    for name, at in first.marks + second.marks:
        assert source[at:].startswith(f'<mark name="{name}"')
    trailing = parse_ssml('<speak>One.<break time="1s"/><mark name="z"/></speak>').script
    assert isinstance(trailing[-1], ScriptMark) and trailing[-1].name == "z"


def test_lexicon_names_are_collected() -> None:
    parsed = parse_ssml('<speak><lexicon uri="drugs"/><lexicon name="streets"/>Hi</speak>')
    assert parsed.lexicons == ("drugs", "streets")


def test_emphasis_is_spoken_as_text_and_own_voice_passes() -> None:
    got = runs(
        '<speak><voice name="joe"><emphasis level="strong">Now</emphasis></voice></speak>',
        voice_of=lambda name: None if name == "joe" else "",
    )
    assert said(got[0]) == "Now"


def test_a_voice_element_makes_runs_in_that_voice() -> None:
    got = runs('<speak>Mine, <voice name="narrator">theirs <voice name="joe">mine again'
               '</voice></voice> and mine.</speak>',
               voice_of=lambda name: {"narrator": "en_GB-x", "joe": None}.get(name, ""))
    assert [(said(r).strip(), r.voice) for r in got] == [
        ("Mine,", None), ("theirs", "en_GB-x"), ("mine again", None), ("and mine.", None)]


def test_phonemes_are_checked_against_the_voice_that_says_them() -> None:
    symbols = {None: set("abc"), "other": set("xyz")}
    source = '<speak><voice name="o"><phoneme ph="xyz">w</phoneme></voice></speak>'
    assert runs(source, symbols=symbols.get, voice_of=lambda _n: "other")[0].voice == "other"
    assert "'x'" in refused(source.replace('name="o"', 'name="me"'), symbols=symbols.get,
                            voice_of=lambda _n: None).message


def test_unknown_elements_speak_their_text_when_ignored() -> None:
    source = "<speak>A <audio src='x.wav'>beep</audio> B</speak>"
    with pytest.raises(InvalidSsml, match="<audio> is not an SSML element") as caught:
        parse_ssml(source)
    assert (caught.value.line, caught.value.column) == (1, 10)
    assert said(runs(source, unknown="ignore")[0]) == "A beep B"


def refused(source: str, **kw: object) -> InvalidSsml:
    with pytest.raises(InvalidSsml) as caught:
        parse_ssml(source, **kw)  # type: ignore[arg-type]
    error = caught.value
    assert error.status == 422 and error.type == "invalid_ssml" and error.field == "text"
    return error


def test_malformed_xml_gives_line_and_column() -> None:
    error = refused("<speak>\n  Hello <s>world</speak>")
    assert (error.line, error.column) == (2, 19)  # the name in "</speak>"
    assert "line 2, column 19" in error.message and "mismatched tag" in error.message


XXE = (
    '<?xml version="1.0"?><!DOCTYPE speak [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>'
    "<speak>&xxe;</speak>"
)
LAUGHS = (
    '<?xml version="1.0"?><!DOCTYPE speak [<!ENTITY a "lol"><!ENTITY b "&a;&a;&a;&a;">'
    '<!ENTITY c "&b;&b;&b;&b;">]><speak>&c;</speak>'
)


@pytest.mark.parametrize("source", [XXE, LAUGHS, "<!DOCTYPE speak><speak>Hi</speak>"])
def test_no_dtd_entity_or_external_reference(source: str) -> None:
    assert "DTD" in refused(source).message


def test_depth_and_element_caps() -> None:
    deep = "<speak>" + "<s>" * 10_000 + "x" + "</s>" * 10_000 + "</speak>"
    assert f"deeper than {MAX_DEPTH}" in refused(deep).message
    many = "<speak>" + '<mark name="m"/>' * (MAX_ELEMENTS + 1) + "</speak>"
    assert f"more than {MAX_ELEMENTS} elements" in refused(many).message


@pytest.mark.parametrize("source,says", [
    ('<speak>a<break time="36000s"/></speak>', "over the 10 s"),
    ('<speak>a<break time="soon"/></speak>', "not a duration"),
    ('<speak>' + '<break time="9s"/>a' * 7 + '</speak>', "more than 60 s of breaks"),
    ('<speak><prosody pitch="+10%">a</prosody></speak>', "prosody pitch is not supported"),
    ('<speak><prosody rate="9">a</prosody></speak>', "outside"),
    ('<speak><prosody volume="+40dB">a</prosody></speak>', "outside"),
    ('<speak><say-as interpret-as="cardinal">twelve</say-as></speak>', "not a whole number"),
    ('<speak><say-as interpret-as="poem">a</say-as></speak>', "not one of"),
    ('<speak><say-as interpret-as="date" format="mdy">2024-13-01</say-as></speak>', "month"),
    ('<speak><sub>WWW</sub></speak>', "needs an alias"),
    ('<speak><phoneme alphabet="x-sampa" ph="a">a</phoneme></speak>', "x-sampa"),
    ('<speak><voice name="../../etc/passwd">a</voice></speak>', "no paths"),
    ('<speak><voice name="other">a</voice></speak>', "not a voice this service serves"),
    ('<speak><lexicon uri="/etc/lex.pls"/>a</speak>', "no paths"),
    ('<speak><say-as interpret-as="digits"><s>1</s></say-as></speak>', "may not be inside"),
    ("<voice>a</voice>", "not <speak>"),
])  # fmt: skip
def test_refusals_name_the_reason(source: str, says: str) -> None:
    assert says in refused(source, voice_of=lambda name: None if name == "joe" else "").message


def test_phoneme_symbols_are_checked_against_the_voice() -> None:
    symbols = set("təmɑːoʊˈ ")
    assert runs('<speak><phoneme ph="təmˈɑːtoʊ">x</phoneme></speak>', symbols=symbols)
    error = refused('<speak><phoneme ph="tʘm">x</phoneme></speak>', symbols=symbols)
    assert "'ʘ' (U+0298)" in error.message


def test_spoken_text_joins_the_runs() -> None:
    parsed = parse_ssml('<speak>Hi <sub alias="there">t</sub>.<break time="1s"/>Bye.</speak>')
    assert parsed.text == "Hi there . Bye."
    assert all(isinstance(p, ScriptText) for r in runs("<speak>x</speak>") for p in r.pieces)


def test_a_phoneme_counts_its_symbols_against_the_sentence_cap() -> None:
    """Spaces between symbols are free; combining marks count, as the voice reads them."""
    (run,) = runs("<speak><phoneme ph='ə ə ə'>x</phoneme></speak>", max_phonemes=3)
    assert run.pieces[0].size == 3
    error = refused("<speak>\n  <phoneme ph='ə̃ə'>x</phoneme></speak>", max_phonemes=2)
    assert "has 3 symbols, more than the 2 a sentence may hold" in error.message
    assert (error.line, error.column) == (2, 3)


def test_a_fragment_reads_as_if_inside_speak_with_spans_and_positions_in_the_source() -> None:
    """ElevenLabs' SSML is text with inline tags and no root: read inside ``<speak>``, yet every
    span, and every position an error names, points into the text the client sent."""
    text = 'Wait <break time="1s"/> now.'
    parsed = parse_ssml(text, fragment=True)
    first, pause, second = parsed.script
    assert isinstance(first, ScriptRun) and isinstance(second, ScriptRun)
    assert pause == ScriptBreak(1.0)
    assert [text[slice(*p.source)] for p in (*first.pieces, *second.pieces)] == ["Wait ", " now."]
    with pytest.raises(InvalidSsml) as caught:
        parse_ssml("Say <bogus/> it.", fragment=True)
    assert (caught.value.line, caught.value.column) == (1, 5)
    document = '<speak>Wait <break time="1s"/> now.</speak>'
    assert parse_ssml(document, fragment=True) == parse_ssml(document)  # a document is itself
    with pytest.raises(InvalidSsml):
        parse_ssml(text)  # without it, a root is required as before
