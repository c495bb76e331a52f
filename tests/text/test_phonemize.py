"""Phoneme ids against the reference phonemizer the voice was trained with.

The reference is piper-phonemize's own pipeline on the same normalized text: espeak-ng's sentence
split and the C++ id mapping (``phoneme_ids_espeak``), independent of our Python id mapping and
segmentation.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from piper_phonemize import phoneme_ids_espeak, phonemize_espeak

from ttsvc.text.frontend import TextFrontEnd
from ttsvc.text.normalize import normalize
from ttsvc.text.phonemize import phoneme_ids, phonemize
from ttsvc.voice import VoiceConfig

CORPUS = [
    line
    for line in (Path(__file__).parent / "corpus.txt").read_text(encoding="utf-8").splitlines()
    if line.strip()
]


def test_corpus_is_large_and_varied() -> None:
    assert len(CORPUS) >= 50
    assert any(ch.isdigit() for line in CORPUS for ch in line)
    assert sum(line.endswith("?") for line in CORPUS) >= 5


@pytest.mark.parametrize("text", CORPUS)
def test_ids_match_reference_phonemizer(text: str, voice_config: VoiceConfig) -> None:
    ours = [list(s.ids) for s in TextFrontEnd(voice_config).sentences(text)]
    reference = [phoneme_ids_espeak(p) for p in phonemize_espeak(normalize(text), "en-us")]
    # espeak-ng reports a closing quote after "?" as an empty sentence (BOS, pad, EOS only);
    # Piper would synthesize a blip of silence for it, we drop it
    assert ours == [ids for ids in reference if len(ids) > 3]


def test_id_rules_bos_pad_eos(voice_config: VoiceConfig) -> None:
    id_map = voice_config.phoneme_id_map
    ids = phoneme_ids(["h", "a"], id_map)
    pad = id_map["_"][0]
    assert ids == [id_map["^"][0], pad, id_map["h"][0], pad, id_map["a"][0], pad, id_map["$"][0]]


def test_unknown_phoneme_is_dropped(voice_config: VoiceConfig) -> None:
    id_map = voice_config.phoneme_id_map
    assert phoneme_ids(["h", "\u4e16"], id_map) == phoneme_ids(["h"], id_map)


def test_espeak_is_guarded_across_threads() -> None:
    """espeak-ng is not re-entrant: concurrent callers must each get their own sentence's result."""
    texts = [f"Sentence number {w}." for w in ("one", "two", "three", "four")] * 5
    expected = {t: phonemize(t, "en-us") for t in set(texts)}
    results: dict[int, list[list[str]]] = {}

    def work(i: int, text: str) -> None:
        results[i] = phonemize(text, "en-us")

    threads = [threading.Thread(target=work, args=(i, t)) for i, t in enumerate(texts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(results[i] == expected[t] for i, t in enumerate(texts))
