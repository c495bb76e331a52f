"""PLS lexicons: what a file may say, where a refused one is at fault, and which words of a text
a lexicon's lexemes apply to."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml

from ttsvc.errors import LexiconError, UnknownLexicon
from ttsvc.text import lexicon as lexicon_module
from ttsvc.text.lexicon import (
    MAX_FILE_BYTES,
    MAX_LEXEMES,
    Lexeme,
    Lexicon,
    LexiconSet,
    Match,
    load_lexicon,
    merge,
    parse_lexicon,
)

HEAD = (
    '<?xml version="1.0" encoding="UTF-8"?>\n'
    '<lexicon version="1.0" xmlns="http://www.w3.org/2005/01/pronunciation-lexicon"'
    ' alphabet="ipa" xml:lang="en-US">\n'
)
"""A file's first two lines: its lexemes start on line 3."""


def pls(*lines: str, head: str = HEAD) -> bytes:
    """A PLS document of ``lines``, one per line from line 3, closed on the line after."""
    return (head + "".join(f"{line}\n" for line in lines) + "</lexicon>\n").encode()


def entry(*graphemes: str, phoneme: str | None = None, alias: str | None = None) -> str:
    """One lexeme on one line."""
    body = "".join(f"<grapheme>{g}</grapheme>" for g in graphemes)
    if phoneme is not None:
        body += f"<phoneme>{phoneme}</phoneme>"
    if alias is not None:
        body += f"<alias>{alias}</alias>"
    return f"  <lexeme>{body}</lexeme>"


def lexicon(*entries: str, name: str = "test") -> Lexicon:
    return parse_lexicon(pls(*entries), f"{name}.pls")


def said(lex: Lexicon | LexiconSet, text: str, names: tuple[str, ...] = ()) -> list[str]:
    """Each match as ``word=pronunciation``: what a reader of a failure wants to see."""
    found = lex.find(text, list(names)) if isinstance(lex, LexiconSet) else lex.find(text)
    return [f"{text[m.start : m.end]}={m.lexeme.phoneme or m.lexeme.alias}" for m in found]


# --- reading files ----------------------------------------------------------------------------


def test_a_polly_style_file_reads_with_lines_and_every_form() -> None:
    data = pls(
        "  <meta name='author' content='ops'/>",
        "  <lexeme>",
        "    <grapheme>W3C</grapheme>",
        "    <alias>World Wide Web Consortium</alias>",
        "  </lexeme>",
        "  <lexeme><grapheme>ACME</grapheme><grapheme>Acme Corp</grapheme>",
        "    <phoneme>ˈæk mi</phoneme><example>ACME ships today</example></lexeme>",
        '  <lexeme alphabet="ipa"><grapheme>  New\n   York </grapheme>'
        '<phoneme alphabet="IPA"> nuː ˈjɔːk </phoneme></lexeme>',
    )
    lex = parse_lexicon(data, "brands.pls")
    assert (lex.name, lex.lang) == ("brands", "en-US")
    assert lex.entries == (
        Lexeme(("W3C",), None, "World Wide Web Consortium", 4),
        Lexeme(("ACME", "Acme Corp"), "ˈæk mi", None, 8),
        Lexeme(("New York",), "nuː ˈjɔːk", None, 10),
    )


def test_the_preferred_pronunciation_is_used_else_the_first() -> None:
    lex = lexicon(
        "  <lexeme><grapheme>tomato</grapheme><phoneme>təˈmeɪtoʊ</phoneme>"
        '<phoneme prefer="true">təˈmɑːtəʊ</phoneme></lexeme>',
        "  <lexeme><grapheme>SQL</grapheme><alias>sequel</alias><phoneme>ɛs kjuː ɛl</phoneme>"
        "</lexeme>",
    )
    assert [(e.phoneme, e.alias) for e in lex.entries] == [("təˈmɑːtəʊ", None),
                                                           (None, "sequel")]  # fmt: skip


def test_the_declared_encoding_is_honoured() -> None:
    data = HEAD.replace("UTF-8", "ISO-8859-1").encode() + (
        "  <lexeme><grapheme>caf\xe9</grapheme><alias>coffee</alias></lexeme>\n</lexicon>\n"
    ).encode("latin-1")
    assert parse_lexicon(data, "fr.pls").entries[0].graphemes == ("café",)


def test_a_file_is_read_from_disk_by_its_name(tmp_path: Path) -> None:
    path = tmp_path / "brands.xml"
    path.write_bytes(pls(entry("ACME", alias="acme")))
    lex = load_lexicon(path)
    assert lex.name == "brands" and len(lex.entries) == 1


REFUSED = [
    # (what, lines after the head, line, column, part of the reason)
    ("unclosed element", [entry("A", alias="a"), "  <lexeme><grapheme>B</grapheme>"], 5, 3,
     "not well-formed"),
    ("no grapheme", [entry("A", alias="a"), "  <lexeme><alias>b</alias></lexeme>"], 4, 3,
     "without a <grapheme>"),
    ("no pronunciation", ["", "    <lexeme><grapheme>B</grapheme></lexeme>"], 4, 5,
     "neither a <phoneme> nor an <alias>"),
    ("empty grapheme", ["  <lexeme><grapheme> </grapheme><alias>b</alias></lexeme>"], 3, 3,
     "empty"),
    ("empty phoneme", [entry("A", phoneme=" ")], 3, 3, "empty <phoneme>"),
    ("grapheme of no word", [entry("--", alias="dash")], 3, 3, "no letter or digit"),
    ("grapheme too long", [entry("a" * 101, alias="b")], 3, 3, "longer than 100"),
    ("lexeme alphabet", ['  <lexeme alphabet="x-sampa"><grapheme>A</grapheme>'
                         "<phoneme>{</phoneme></lexeme>"], 3, 3, "'x-sampa' is not supported"),
    ("phoneme alphabet", [entry("A", alias="a"), '  <lexeme><grapheme>B</grapheme>'
                          '<phoneme alphabet="sapi">b</phoneme></lexeme>'], 4, 3,
     "'sapi' is not supported"),
    ("unknown element in a lexeme", ["  <lexeme><grapheme>A</grapheme><say>a</say></lexeme>"],
     3, 33, "<say> is not a PLS 1.0 element"),
    ("unknown element in the lexicon", [entry("A", alias="a"), "  <rule/>"], 4, 3,
     "<rule> is not a PLS 1.0 element"),
    ("element in a grapheme", ["  <lexeme><grapheme>A<b/></grapheme><alias>a</alias></lexeme>"],
     3, 22, "text only"),
    ("element of another namespace", ['  <x:lexeme xmlns:x="urn:x"/>'], 3, 3,
     "not the PLS namespace"),
]  # fmt: skip


@pytest.mark.parametrize(("lines", "line", "column", "reason"),
                         [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])  # fmt: skip
def test_a_bad_lexeme_is_refused_at_its_line(
    lines: list[str], line: int, column: int, reason: str
) -> None:
    with pytest.raises(LexiconError) as refused:
        parse_lexicon(pls(*lines), "bad.pls")
    error = refused.value
    assert (error.file, error.line, error.column) == ("bad.pls", line, column)
    assert reason in error.reason
    assert error.message.startswith(f"bad.pls:{line}:{column}: ")
    assert error.public() == {"file": "bad.pls", "line": line, "column": column,
                              "reason": error.reason}  # fmt: skip
    assert (error.status, error.type) == (422, "invalid_lexicon")


HEADS = [
    ("no namespace", HEAD.replace(' xmlns="http://www.w3.org/2005/01/pronunciation-lexicon"', ""),
     "no namespace"),
    ("no version", HEAD.replace('<lexicon version="1.0"', "<lexicon"), "version"),
    ("version 2", HEAD.replace('version="1.0"', 'version="2.0"'), "version"),
    ("no language", HEAD.replace(' xml:lang="en-US"', ""), "xml:lang"),
    ("a bad language", HEAD.replace('xml:lang="en-US"', 'xml:lang="../en"'), "language tag"),
    ("no alphabet", HEAD.replace(' alphabet="ipa"', ""), 'alphabet="ipa"'),
    ("x-sampa", HEAD.replace('alphabet="ipa"', 'alphabet="x-sampa"'), "only \"ipa\""),
]  # fmt: skip


@pytest.mark.parametrize(("head", "reason"), [h[1:] for h in HEADS], ids=[h[0] for h in HEADS])
def test_a_bad_lexicon_element_is_refused_at_line_2(head: str, reason: str) -> None:
    with pytest.raises(LexiconError) as refused:
        parse_lexicon(pls(entry("A", alias="a"), head=head), "bad.pls")
    assert (refused.value.line, refused.value.column) == (2, 1)
    assert reason in refused.value.reason


def test_the_root_must_be_a_lexicon() -> None:
    declaration = HEAD.split("\n", maxsplit=1)[0]
    document = f'{declaration}\n<lexeme xmlns="http://www.w3.org/2005/01/pronunciation-lexicon"/>'
    with pytest.raises(LexiconError) as refused:
        parse_lexicon(document.encode(), "bad.pls")
    assert (refused.value.line, refused.value.column) == (2, 1)
    assert "the root element must be <lexicon>" in refused.value.reason


def test_a_phoneme_symbol_outside_the_allowed_set_is_refused_naming_it() -> None:
    data = pls(entry("ACME", phoneme="ˈækmi"), entry("Zed", phoneme="zɛʔ"))
    symbols = set("ˈækmizɛd ")
    assert len(parse_lexicon(data[:], "ok.pls", symbols=symbols | {"ʔ"}).entries) == 2
    with pytest.raises(LexiconError) as refused:
        parse_lexicon(data, "voice.pls", symbols=symbols)
    assert (refused.value.line, refused.value.column) == (4, 3)
    assert "'ʔ' (U+0294)" in refused.value.reason


def test_caps_on_size_lexemes_and_depth() -> None:
    big = pls(f"  <!-- {'x' * MAX_FILE_BYTES} -->")
    with pytest.raises(LexiconError) as too_big:
        parse_lexicon(big, "big.pls")
    assert too_big.value.line is None and "more than the 1048576" in too_big.value.reason

    many = [entry(f"w{i}", alias="x") for i in range(MAX_LEXEMES)]
    assert len(parse_lexicon(pls(*many), "full.pls").entries) == MAX_LEXEMES
    with pytest.raises(LexiconError) as too_many:
        parse_lexicon(pls(*many, entry("one more", alias="x")), "over.pls")
    assert too_many.value.line == 3 + MAX_LEXEMES and "more than 10000" in too_many.value.reason

    deep = "<metadata>" + "<x>" * 20 + "</x>" * 20 + "</metadata>"
    with pytest.raises(LexiconError) as too_deep:
        parse_lexicon(pls(deep), "deep.pls")
    assert too_deep.value.line == 3 and "deeper than 16" in too_deep.value.reason


def test_the_charts_example_lexicons_parse() -> None:
    """What the chart's example values mount is what the service loads."""
    values = Path(__file__).resolve().parents[2] / "helm" / "ttsvc" / "ci" / "lexicons-values.yaml"
    files = yaml.safe_load(values.read_text(encoding="utf-8"))["lexicons"]
    assert {name: len(parse_lexicon(text.encode(), name).entries)
            for name, text in files.items()} == {"brands.pls": 2, "de.xml": 1}  # fmt: skip


def test_a_name_is_never_a_path() -> None:
    with pytest.raises(LexiconError, match="not a lexicon name"):
        parse_lexicon(pls(entry("A", alias="a")), "my lexicon.pls")
    with pytest.raises(LexiconError, match="not a lexicon name"):
        parse_lexicon(pls(entry("A", alias="a")), "ok.pls", name="../etc")


# --- unsafe XML -------------------------------------------------------------------------------

BILLION_LAUGHS = (
    '<?xml version="1.0"?>\n'
    "<!DOCTYPE lexicon [\n"
    ' <!ENTITY lol "lol">\n'
    + "".join(f' <!ENTITY lol{i} "{("&lol" + str(i - 1) + ";") * 10}">\n'
              for i in range(1, 10)).replace("&lol0;", "&lol;")
    + "]>\n"
    '<lexicon version="1.0" xmlns="http://www.w3.org/2005/01/pronunciation-lexicon"'
    ' alphabet="ipa" xml:lang="en-US">\n'
    "  <lexeme><grapheme>lol</grapheme><alias>&lol9;</alias></lexeme>\n</lexicon>\n"
)  # fmt: skip
XXE = (
    '<?xml version="1.0"?>\n'
    '<!DOCTYPE lexicon [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>\n'
    '<lexicon version="1.0" xmlns="http://www.w3.org/2005/01/pronunciation-lexicon"'
    ' alphabet="ipa" xml:lang="en-US">\n'
    "  <lexeme><grapheme>root</grapheme><alias>&xxe;</alias></lexeme>\n</lexicon>\n"
)
EXTERNAL_DTD = (
    '<?xml version="1.0"?>\n'
    '<!DOCTYPE lexicon SYSTEM "http://127.0.0.1:9/pls.dtd">\n' + HEAD.split("\n", 1)[1]
    + "</lexicon>\n"
)  # fmt: skip


@pytest.mark.parametrize("document", [BILLION_LAUGHS, XXE, EXTERNAL_DTD],
                         ids=["billion laughs", "XXE", "external DTD"])  # fmt: skip
def test_dtds_entities_and_external_references_are_refused_before_any_expansion(
    document: str,
) -> None:
    with pytest.raises(LexiconError) as refused:
        parse_lexicon(document.encode(), "evil.pls")
    assert refused.value.line == 2
    assert "is not allowed" in refused.value.reason and "DTD" in refused.value.reason


def test_an_undeclared_entity_is_malformed_xml_not_a_lookup() -> None:
    with pytest.raises(LexiconError) as refused:
        parse_lexicon(pls(entry("A", alias="&secret;")), "evil.pls")
    assert (refused.value.line, refused.value.column) == (3, 40)
    assert "undefined entity" in refused.value.reason


# --- matching ---------------------------------------------------------------------------------


def test_whole_words_only() -> None:
    lex = lexicon(entry("ACME", phoneme="ækmi"))
    assert said(lex, "ACME, ACMEs, xACME, ACME's, ACME-based, ACME2, _ACME, (ACME)") == [
        "ACME=ækmi", "ACME=ækmi", "ACME=ækmi", "ACME=ækmi"
    ]  # fmt: skip


def test_the_case_rule() -> None:
    """A grapheme with a capital matches only as written; an all-lowercase one, any case."""
    lex = lexicon(entry("ACME", alias="exact"), entry("nasa", alias="any"),
                  entry("iPhone", alias="phone"))  # fmt: skip
    assert said(lex, "ACME Acme acme") == ["ACME=exact"]
    assert said(lex, "nasa Nasa NASA nAsA") == ["nasa=any", "Nasa=any", "NASA=any", "nAsA=any"]
    assert said(lex, "iPhone iphone IPHONE") == ["iPhone=phone"]


def test_an_exact_grapheme_beats_a_lowercase_one_of_the_same_word() -> None:
    lex = lexicon(entry("us", alias="us"), entry("US", alias="you ess"))
    assert said(lex, "US and us and Us") == ["US=you ess", "us=us", "Us=us"]


def test_multi_word_graphemes_match_across_any_whitespace() -> None:
    lex = lexicon(entry("New York", alias="the big apple"))
    assert said(lex, "New York, New\n  York, NewYork, New Yorker, new york") == [
        "New York=the big apple", "New\n  York=the big apple"
    ]  # fmt: skip


def test_longest_first_then_left_to_right_without_overlaps() -> None:
    lex = lexicon(entry("New", alias="1"), entry("New York", alias="2"),
                  entry("New York City", alias="3"), entry("York", alias="4"),
                  entry("city", alias="5"))  # fmt: skip
    text = "New York City, New York, New city, York"
    assert said(lex, text) == ["New York City=3", "New York=2", "New=1", "city=5", "York=4"]
    spans = [(m.start, m.end) for m in lex.find(text)]
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))


def test_the_first_lexeme_of_a_grapheme_wins() -> None:
    lex = lexicon(entry("read", alias="reed"), entry("read", "lead", alias="red"))
    assert said(lex, "read lead") == ["read=reed", "lead=red"]


def test_unicode_words() -> None:
    lex = lexicon(entry("Москва", alias="Moscow"), entry("straße", alias="street"),
                  entry("cafe", alias="coffee"), entry("नमस्ते", alias="hello"),
                  entry("東京", alias="Tokyo"))  # fmt: skip
    assert said(lex, "Москва, Москвы") == ["Москва=Moscow"]
    assert said(lex, "Straße STRASSE straßen") == ["Straße=street"]
    # a combining accent continues the word: "cafe" is not the start of "café" spelt decomposed
    assert said(lex, "cafe cafe\u0301 cafés") == ["cafe=coffee"]
    # Devanagari's vowel signs and virama are marks, not word ends
    assert said(lex, "नमस्ते नमस्तेजी") == ["नमस्ते=hello"]
    assert said(lex, "東京 東京都") == ["東京=Tokyo"]  # scripts without spaces: whole runs only


def test_special_characters_in_graphemes_are_literal() -> None:
    lex = lexicon(entry("C++", alias="C plus plus"), entry("a.m.", alias="morning"),
                  entry("R&amp;D", alias="research"))  # fmt: skip
    assert said(lex, "C++ and a.m. and R&D, not aXmX") == [
        "C++=C plus plus", "a.m.=morning", "R&D=research"
    ]  # fmt: skip


def test_lookup_applies_the_case_rule_to_one_word() -> None:
    lex = lexicon(entry("ACME", alias="a"), entry("nasa", alias="n"))
    assert lex.lookup("NASA") is not None and lex.lookup("Acme") is None
    assert lex.lookup("ACME") == lex.entries[0]


def test_an_empty_lexicon_matches_nothing() -> None:
    assert parse_lexicon(pls(), "empty.pls").find("anything at all") == []


def test_ten_thousand_lexemes_compile_and_match() -> None:
    lex = parse_lexicon(pls(*(entry(f"w{i}", alias=f"word {i}") for i in range(MAX_LEXEMES))),
                        "big.pls")  # fmt: skip
    assert said(lex, "w1 w9999 w10000 W5") == ["w1=word 1", "w9999=word 9999", "W5=word 5"]


# --- several lexicons -------------------------------------------------------------------------


def test_merge_keeps_the_earlier_groups_matches_on_overlap() -> None:
    a, b = Lexeme(("x",), None, "a", 1), Lexeme(("y",), None, "b", 1)
    first = [Match(5, 10, a, "A"), Match(20, 25, a, "A")]
    second = [Match(0, 4, b, "B"), Match(3, 6, b, "B"), Match(10, 12, b, "B"),
              Match(24, 30, b, "B"), Match(30, 31, b, "B")]  # fmt: skip
    assert [(m.start, m.lexicon) for m in merge([first, second])] == [
        (0, "B"), (5, "A"), (10, "B"), (20, "A"), (30, "B")
    ]  # fmt: skip


def test_a_set_applies_named_lexicons_first_named_winning() -> None:
    brands = lexicon(entry("Apple", alias="brand"), entry("Apple Music", alias="service"),
                     name="brands")  # fmt: skip
    fruit = lexicon(entry("apple", alias="fruit"), entry("Music", alias="muzak"), name="fruit")
    both = LexiconSet({"brands": brands, "fruit": fruit})
    text = "Apple Music and an apple"
    assert said(both, text, ("brands", "fruit")) == ["Apple Music=service", "apple=fruit"]
    assert said(both, text, ("fruit", "brands")) == ["Apple=fruit", "Music=muzak",
                                                     "apple=fruit"]  # fmt: skip
    assert said(both, text, ("fruit", "fruit")) == said(both, text, ("fruit",))
    assert [m.lexicon for m in both.find(text, ["brands", "fruit"])] == ["brands", "fruit"]
    with pytest.raises(UnknownLexicon) as unknown:
        both.find(text, ["brands", "/etc/passwd"])
    assert unknown.value.field == "lexicons" and "'/etc/passwd'" in unknown.value.message


def test_a_set_is_immutable_and_knows_languages() -> None:
    us = parse_lexicon(pls(entry("A", alias="a")), "us.pls")
    en = parse_lexicon(pls(entry("A", alias="a"), head=HEAD.replace("en-US", "en")), "en.pls")
    de = parse_lexicon(pls(entry("A", alias="a"), head=HEAD.replace("en-US", "de-DE")), "de.pls")
    source = {"us": us, "en": en, "de": de}
    lexicons = LexiconSet(source)
    source.clear()
    assert len(lexicons) == 3 and "us" in lexicons
    assert lexicons.for_language("en_US") == ("en", "us")
    assert lexicons.for_language("en-GB") == ("en",)
    assert lexicons.for_language("de") == ()
    with pytest.raises(TypeError):
        lexicons.lexicons["x"] = us  # type: ignore[index]


def test_caps_are_read_when_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The module's caps are settings of the module, not copies baked into the parser."""
    monkeypatch.setattr(lexicon_module, "MAX_LEXEMES", 2)
    with pytest.raises(LexiconError, match="more than 2 lexemes"):
        lexicon(entry("a", alias="a"), entry("b", alias="b"), entry("c", alias="c"))
