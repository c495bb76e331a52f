"""Texts that crashed espeak-ng (inside piper-phonemize), and their neighbours that never did.

Each ``POISON`` entry made espeak-ng 1.51 overflow a buffer and kill the process running it (a
worker, and every stream it carried). ``NEIGHBOURS`` are nearby shapes, and real abbreviations and
long words, that must keep being spoken.

Data only, and never imported by the service itself. It lives in the package, beside the guards
in ``ttsvc.text.espeak_guards`` that exist for these shapes, because two consumers need the same
list: the tests (front end and a real server) and ``benchmarks/reliability_bench.py``; the
benchmarks do not import the tests.
"""

from __future__ import annotations

POISON: dict[str, str] = {
    # single letters joined by dots: one espeak "word" read as an abbreviation, letter by letter
    "a.x90": "a." * 90,
    "b.x90": "b." * 90,
    "x.x120": "x." * 120,
    "a.b.x50": "a.b." * 50,
    "A-leading-dot": ".A" * 90,
    "dot-before-letter": " .b" * 90,
    "dot-then-space": ".b " * 90,
    "e-acute.x60": "é." * 60,
    "cyrillic.x60": "ж." * 60,
    "cjk.x40": "中." * 40,
    "math-bold.x30": "𝐚." * 30,
    "inside-a-sentence": "Hello " + "a." * 90 + " world.",
    "a.x1000": "a." * 1000,
    # one word that stacks a suffix again and again
    "s-apostrophe.x80": "s'" * 80,
    "s-right-quote.x80": "s’" * 80,
    "s-question.x80": "s?" * 80,
    # these crash once a sentence may be longer than the default 200 characters
    "a.,x90": "a.," * 90,
    "e.g.x240": "e.g." * 240,
    "ness.x80": "ness" * 80,
    "a's.x200": "a's" * 200,
    "a.b-space.x60": "a.b. " * 60,  # a dot before a lowercase word does not end espeak's clause
    "underscore-a.m.x150": "___a.m." * 150,
}
NEIGHBOURS: dict[str, str] = {
    "a.x80": "a." * 80,
    "a-dot-space.x90": "a. " * 90,
    "ab.x90": "ab." * 90,
    "aa.x60": "aa." * 60,
    "abbreviations": "The U.S.A. and the U.K. met, e.g. at 5 p.m., i.e. after the Ph.D. talk.",
    "digits.x60": "1." * 60,
    "long-word": "pneumonoultramicroscopicsilicovolcanoconiosis " * 10,
    "one-letter.x1000": "a" * 1000,
    "o-slash.x600": "ø" * 600,
}
