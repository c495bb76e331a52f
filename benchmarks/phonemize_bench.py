"""Cost of running espeak-ng in its own process: per call, side by side with the in-process call.

Phonemizes the normalized benchmark corpus (short prompts) and 200-character sentences both ways,
alternating rounds so machine noise hits both alike, and times a crashing call (which replaces the
child) and the call after it.
Prints a markdown table. Run from the repository root:

    python benchmarks/phonemize_bench.py
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from piper_phonemize import phonemize_espeak

from ttsvc.errors import UnspeakableText
from ttsvc.text.normalize import normalize
from ttsvc.text.phonemize import EspeakProcess

LONG = (
    "A sentence of about two hundred characters, as the segmenter cuts them at most, with "
    "clauses, commas and a number or two, twenty-four, takes espeak-ng a little longer to read."
)


def _per_call_us(call: Callable[[str], object], texts: list[str]) -> float:
    started = time.perf_counter()
    for text in texts:
        call(text)
    return 1e6 * (time.perf_counter() - started) / len(texts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", type=Path, default=Path("benchmarks/corpus.txt"))
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--crashes", type=int, default=5)
    args = parser.parse_args()
    lines = args.corpus.read_text(encoding="utf-8").splitlines()
    sets = {
        "corpus prompt": [normalize(line) for line in lines if line.strip()],
        "200-char sentence": [LONG] * 50,
    }
    espeak = EspeakProcess()
    ways: dict[str, Callable[[str], object]] = {
        "in process": lambda t: phonemize_espeak(t, "en-us"),
        "child process": lambda t: espeak.sentences(t, "en-us"),
    }
    for call in ways.values():
        call("warm up")
    print("| text | in process µs/call | child process µs/call | extra µs/call |")
    print("|---|---|---|---|")
    for name, texts in sets.items():
        runs: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(args.rounds):
            for way, call in ways.items():
                runs[way].append(_per_call_us(call, texts))
        inproc, child = (statistics.median(runs[way]) for way in ways)
        print(f"| {name} | {inproc:.0f} | {child:.0f} | {child - inproc:.0f} |")
    crashed, after = [], []
    for _ in range(args.crashes):
        started = time.perf_counter()
        try:
            espeak.sentences("a." * 90, "en-us")  # raw text: crashes espeak-ng in the child
        except UnspeakableText:
            pass
        crashed.append(time.perf_counter() - started)
        started = time.perf_counter()
        espeak.sentences("The next call finds a fresh child.", "en-us")
        after.append(time.perf_counter() - started)
    espeak.close()
    crash_ms, after_ms = 1000 * statistics.median(crashed), 1000 * statistics.median(after)
    print(f"\ncrashing call (422, child replaced): median {crash_ms:.0f} ms; "
          f"the call after it: {after_ms:.1f} ms ({args.crashes} crashes)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
