"""espeak-ng phonemes and Piper ids, exactly as the default voice was trained.

The voice (``piper_version`` 1.0.0) was trained on phonemes from ``piper-phonemize``'s espeak-ng
1.51 fork. ``piper-phonemize-fix`` is the same code with wheels for CPython 3.10-3.13, and its
output was measured identical to ``piper-phonemize`` 1.1.0; ``piper-tts`` 1.8 bundles espeak-ng
1.52, whose vowels differ in about 40 % of sentences (e.g. ``stˈɔːɹ`` for ``stˈoːɹ``), so it is
not used. espeak-ng keeps global state and is not re-entrant, so every call holds one lock.
"""

from __future__ import annotations

import threading
import unicodedata
from collections.abc import Mapping, Sequence

from piper_phonemize import phonemize_espeak

PAD = "_"
BOS = "^"
EOS = "$"

_ESPEAK_LOCK = threading.Lock()


def phonemize(text: str, espeak_voice: str) -> list[list[str]]:
    """Phonemes of ``text``, one list per sentence espeak-ng finds in it.

    Each phoneme is one Unicode code point after NFD decomposition, as Piper splits them.
    """
    with _ESPEAK_LOCK:
        sentences: list[list[str]] = phonemize_espeak(text, espeak_voice)
    return [
        list(unicodedata.normalize("NFD", "".join(sentence)))
        for sentence in sentences
        if "".join(sentence).strip()
    ]


def phoneme_ids(phonemes: Sequence[str], id_map: Mapping[str, Sequence[int]]) -> list[int]:
    """Map phonemes to ids with Piper's rules: BOS, a pad after every phoneme, EOS.

    Phonemes missing from the voice's map are dropped, as Piper drops them: the voice has never
    seen them and has no id to give.
    """
    pad = list(id_map[PAD])
    ids = [*id_map[BOS], *pad]
    for phoneme in phonemes:
        mapped = id_map.get(phoneme)
        if mapped is None:
            continue
        ids.extend(mapped)
        ids.extend(pad)
    ids.extend(id_map[EOS])
    return ids
