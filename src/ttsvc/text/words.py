"""Spoken words of a sentence: which phoneme ids say each word of the request text.

Word timestamps are the frames of a word's phoneme ids, so each written word must be found in
the phonemes espeak-ng made of its sentence. espeak-ng's words are not the text's: it joins
unstressed words ("of the" -> ``ʌvðə``, "Wait... what?" -> one word), joins hyphenated ones, and
reads one written token as several ("example.com", "123"). So the sentence's phoneme words are
aligned with each token's phonemes said alone (one extra espeak-ng call for the whole sentence,
tokens one per paragraph so none is joined to another): a monotone alignment by phoneme counts,
where a phoneme word may cover several tokens' words (split between them by their phoneme
counts) or a token's word several phoneme words.

Pure functions: the phonemizer is passed in.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ttsvc.text.phonemize import BOS, PAD
from ttsvc.text.tracked import Normalized

STRESS = frozenset("ˈˌ")
"""Stress marks: phonemes of their own in Piper's ids, said with the phoneme after them."""
PUNCTUATION = frozenset('.,;:!?¡¿—…"«»“”()-')
"""Characters of espeak-ng's output that are pauses or intonation, not part of a word."""
TOKEN_SEPARATOR = "\n\n"
"""Between tokens phonemized alone: a paragraph break, so espeak-ng joins none of them."""
_TOKEN_RE = re.compile(r"\S+")
_EDGE_RE = re.compile(r"^[^\w]+|[^\w]+$")


@dataclass(frozen=True)
class SpokenWord:
    """One word of the request text as a sentence says it."""

    text: str
    """The word as spoken: the normalized text ("twelve" for a part of "$12.50")."""
    span: tuple[int, int]
    """``[start, end)`` of the request text it came from; words made from one written form
    ("$12.50" -> "twelve dollars and fifty cents") all carry that form's span."""
    ids: tuple[int, int]
    """``[first, end)`` positions in the sentence's phoneme ids: its first phoneme's id to the
    pad after its last."""


@dataclass(frozen=True)
class Token:
    """A written word of a sentence: a run without spaces, outer punctuation stripped."""

    text: str
    span: tuple[int, int]
    """In the request text."""


def tokens(piece: str, start: int, normalized: Normalized) -> list[Token]:
    """The words of ``piece``, which starts at ``start`` of ``normalized.text``."""
    out = []
    for match in _TOKEN_RE.finditer(piece):
        word = _EDGE_RE.sub("", match.group(0))
        if not any(ch.isalnum() for ch in word):
            continue
        lead = match.group(0).find(word)
        a = start + match.start() + lead
        out.append(Token(word, normalized.source(a, a + len(word))))
    return out


def phoneme_words(phonemes: Sequence[str]) -> list[list[int]]:
    """Indices of the phonemes of each word (spaces split words; punctuation belongs to none)."""
    words: list[list[int]] = [[]]
    for i, phoneme in enumerate(phonemes):
        if phoneme.isspace():
            words.append([])
        elif phoneme not in PUNCTUATION:
            words[-1].append(i)
    return [w for w in words if w]


def id_positions(
    phonemes: Sequence[str], id_map: Mapping[str, Sequence[int]]
) -> list[tuple[int, int] | None]:
    """Per phoneme, its ``[first, end)`` ids including the pad after it (``phoneme_ids``'s
    layout); ``None`` for a phoneme the voice has no id for (dropped from the ids)."""
    pad = len(id_map[PAD])
    cursor = len(id_map[BOS]) + pad
    out: list[tuple[int, int] | None] = []
    for phoneme in phonemes:
        mapped = id_map.get(phoneme)
        if mapped is None:
            out.append(None)
            continue
        out.append((cursor, cursor + len(mapped) + pad))
        cursor += len(mapped) + pad
    return out


def _core(word: str) -> str:
    return "".join(ch for ch in word if ch not in STRESS and ch not in PUNCTUATION)


_MERGE = 3
"""Most token words one phoneme word may join (and phoneme words one token word may split in)."""


def align(spoken: Sequence[str], alone: Sequence[tuple[int, str]]) -> list[list[tuple[int, str]]]:
    """Which tokens each phoneme word of a sentence says.

    ``spoken``: the sentence's phoneme words; ``alone``: the words of its tokens phonemized alone,
    each with its token's index, in order. Returns, per spoken word, ``(token, phonemes)`` pairs:
    each token it says, with that token's phonemes said alone (stress left out), to cut a word
    that says several tokens between them.

    A monotone alignment minimizing, over matched groups, the difference in phoneme count plus
    a mismatch of first phonemes; joins and splits cost a little more, so a 1:1 match wins ties.
    """
    m, n = len(spoken), len(alone)
    s_core = [_core(w) for w in spoken]
    a_core = [_core(w) for _, w in alone]
    inf = float("inf")
    cost = [[inf] * (n + 1) for _ in range(m + 1)]
    back: list[list[tuple[int, int]]] = [[(0, 0)] * (n + 1) for _ in range(m + 1)]
    cost[0][0] = 0.0
    moves = [(1, r) for r in range(1, _MERGE + 1)] + [(r, 1) for r in range(2, _MERGE + 1)]
    moves += [(1, 0), (0, 1)]
    for i in range(m + 1):
        for j in range(n + 1):
            here = cost[i][j]
            if here == inf:
                continue
            for di, dj in moves:
                ii, jj = i + di, j + dj
                if ii > m or jj > n:
                    continue
                if di == 0 or dj == 0:
                    step = 3.0  # a word on one side only
                else:
                    left, right = "".join(s_core[i:ii]), "".join(a_core[j:jj])
                    step = abs(len(left) - len(right)) + 0.5 * (di + dj - 2)
                    step += 0.0 if left[:1] == right[:1] else 1.0
                if here + step < cost[ii][jj]:
                    cost[ii][jj] = here + step
                    back[ii][jj] = (di, dj)
    out: list[list[tuple[int, str]]] = [[] for _ in range(m)]
    i, j = m, n
    while i > 0 or j > 0:
        di, dj = back[i][j]
        if di == 0 and dj == 0:  # unreachable: every cell is reached from (0, 0)
            break
        i, j = i - di, j - dj
        if di == 0:
            continue
        if dj == 0:  # said but no token's: the nearest token before (or after) says it
            continue
        said: dict[int, str] = {}
        for k in range(j, j + dj):
            said[alone[k][0]] = said.get(alone[k][0], "") + a_core[k]
        for word in range(i, i + di):
            out[word] = list(said.items())
    return out


def spoken_words(
    sentences: Sequence[Sequence[str]],
    toks: Sequence[Token],
    alone: Sequence[str] | None,
    id_map: Mapping[str, Sequence[int]],
) -> list[list[SpokenWord]]:
    """Per sentence espeak-ng made of one text piece, the words it says.

    ``sentences``: the piece's sentences as phonemes; ``toks``: the piece's tokens; ``alone``:
    each token phonemized alone (``None`` when that call did not give one answer per token:
    each token then counts as one word as long as its letters).
    """
    spoken: list[tuple[int, list[int]]] = []  # (sentence, phoneme indices) per phoneme word
    for index, phonemes in enumerate(sentences):
        spoken.extend((index, word) for word in phoneme_words(phonemes))
    said = ["".join(sentences[s][p] for p in word) for s, word in spoken]
    if alone is not None and len(alone) == len(toks):
        pairs = [(t, w) for t, text in enumerate(alone) for w in text.split() if _core(w)]
    else:
        pairs = [(t, "x" * sum(ch.isalnum() for ch in tok.text)) for t, tok in enumerate(toks)]
    shares = align(said, pairs)
    # each token's phonemes, in its first sentence
    owned: dict[int, tuple[int, list[int]]] = {}
    for (sentence, word), parts in zip(spoken, shares, strict=True):
        for token, indices in _split(sentences[sentence], word, parts):
            first = owned.setdefault(token, (sentence, []))
            if first[0] == sentence:
                first[1].extend(indices)
    out: list[list[SpokenWord]] = [[] for _ in sentences]
    positions = [id_positions(phonemes, id_map) for phonemes in sentences]
    for token in sorted(owned):
        sentence, indices = owned[token]
        ids = [pos for p in sorted(indices) if (pos := positions[sentence][p]) is not None]
        if ids:
            tok = toks[token]
            out[sentence].append(SpokenWord(tok.text, tok.span, (ids[0][0], ids[-1][1])))
    return out


def _split(
    phonemes: Sequence[str], word: list[int], parts: list[tuple[int, str]]
) -> list[tuple[int, list[int]]]:
    """A phoneme word's indices cut between the tokens it says, in order: its phonemes are
    aligned (edit distance) with the tokens' phonemes said alone, so ``fɚðə`` cuts as ``fɚ|ðə``
    after ``fɔːɹ`` + ``ðə``; a stress mark goes with the phoneme after it."""
    if len(parts) <= 1:
        return [(parts[0][0], word)] if parts else []
    core = [i for i in word if phonemes[i] not in STRESS]
    said = [phonemes[i] for i in core]
    target = [ch for _, text in parts for ch in text]
    owner = [k for k, (_, text) in enumerate(parts) for _ in text]
    n, m = len(said), len(target)
    dist = [[0] * (m + 1) for _ in range(n + 1)]
    for a in range(n + 1):
        for b in range(m + 1):
            if a == 0 or b == 0:
                dist[a][b] = a + b
                continue
            dist[a][b] = min(dist[a - 1][b - 1] + (said[a - 1] != target[b - 1]),
                             dist[a - 1][b] + 1, dist[a][b - 1] + 1)  # fmt: skip
    part_of = [0] * n
    a, b = n, m
    while a > 0:
        if b > 0 and dist[a][b] == dist[a - 1][b - 1] + (said[a - 1] != target[b - 1]):
            a, b = a - 1, b - 1
            part_of[a] = owner[b]
        elif b > 0 and dist[a][b] == dist[a][b - 1] + 1:
            b -= 1
        else:  # said but not in the tokens alone: with the token of what precedes it
            a -= 1
            part_of[a] = owner[b - 1] if b > 0 else 0
    out: list[tuple[int, list[int]]] = [(token, []) for token, _ in parts]
    pending: list[int] = []  # stress marks wait for their phoneme
    position = {i: k for k, i in enumerate(core)}
    for i in word:
        if i not in position:
            pending.append(i)
            continue
        out[part_of[position[i]]][1].extend([*pending, i])
        pending = []
    if pending:
        out[-1][1].extend(pending)
    return [(token, sorted(indices)) for token, indices in out if indices]


Phonemizer = Callable[[str], list[str]]
"""Text to espeak-ng's phonemes, one string per sentence it finds."""


def phonemize_alone(toks: Sequence[Token], phonemizer: Phonemizer) -> list[str] | None:
    """Each token's phonemes said on its own; ``None`` when espeak-ng did not answer one
    paragraph per token."""
    if not toks:
        return []
    answer = phonemizer(TOKEN_SEPARATOR.join(tok.text for tok in toks))
    return answer if len(answer) == len(toks) else None
