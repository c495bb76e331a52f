"""``say-as``: each kind reads its content one way, and refuses what it is not."""

from __future__ import annotations

import pytest

from ttsvc.text.say_as import say_as


@pytest.mark.parametrize("kind,content,fmt,words", [
    ("characters", "ABC", None, "A B C"),
    ("spell-out", "a1-b", None, "A one dash B"),
    ("cardinal", "1,234", None, "one thousand two hundred thirty four"),
    ("cardinal", "-7", None, "minus seven"),
    ("number", "3.14", None, "three point one four"),
    ("ordinal", "21", None, "twenty first"),
    ("ordinal", "3rd", None, "third"),
    ("digits", "1234", None, "one two three four"),
    ("telephone", "+1 (555) 010-2030", None,
     "plus one, five five five, zero one zero, two zero three zero"),
    ("date", "03/15/2024", "mdy", "March fifteenth, twenty twenty four"),
    ("date", "15.03.2024", "dmy", "March fifteenth, twenty twenty four"),
    ("date", "2024-03-15", "ymd", "March fifteenth, twenty twenty four"),
    ("date", "Mar 15", "md", "March fifteenth"),
    ("date", "15", "d", "the fifteenth"),
    ("date", "1999", "y", "nineteen ninety nine"),
    ("time", "14:30", None, "fourteen thirty"),
    ("time", "9:05 pm", None, "nine oh five P M"),
    ("currency", "$12.50", None, "twelve dollars and fifty cents"),
    ("currency", "12.50", None, "twelve dollars and fifty cents"),
])  # fmt: skip
def test_each_kind(kind: str, content: str, fmt: str | None, words: str) -> None:
    assert say_as(kind, content, fmt).replace("-", " ") == words


@pytest.mark.parametrize("kind,content,fmt,reason", [
    ("cardinal", "many", None, "not a whole number"),
    ("digits", "12a", None, "not a string of digits"),
    ("telephone", "call me", None, "not a telephone number"),
    ("date", "2024-02-30", "ymd", "not a day of that month"),
    ("date", "03/15", "mdy", "does not have the 3 parts"),
    ("date", "03/15/2024", "qq", "format"),
    ("time", "25:00", None, "not a time of day"),
    ("currency", "lots", None, "not an amount of money"),
    ("characters", "!!", None, "nothing to spell out"),
    ("ordinal", "-2", None, "negative"),
    ("unit", "5 kg", None, "not one of"),
])  # fmt: skip
def test_refusals(kind: str, content: str, fmt: str | None, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        say_as(kind, content, fmt)
