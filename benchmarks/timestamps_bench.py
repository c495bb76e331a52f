"""How well word timestamps agree with the audio, and what asking for them costs the front end.

Three figures, printed as a markdown table. Run from the repository root:

    python benchmarks/timestamps_bench.py [--engines-dir DIR]

* **frames**: over the corpus (noise 0), the share of words whose start frame is where the
  latents change column (each phoneme id's frames repeat its encoder column, so a start that is
  not on a change would not be where a phoneme begins), and of sentences whose durations sum
  to the latents' frames;
* **onsets**: words after a pause that start with a vowel or a sonorant (heard from their first
  frame; a stop consonant's closure is silent), at three speeds: the distance from the word's
  start to the first frame past the pause whose energy rises above a tenth of the loudest;
* **front end**: milliseconds per corpus line of ``sentences(text)`` and of
  ``sentences(text, words=True)`` (the second espeak-ng call and the alignment), side by side.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from pathlib import Path

import numpy as np

from ttsvc.backends.loader import load_engine_set
from ttsvc.compile.build import ensure_default_voice
from ttsvc.synthesis import SynthesisParams, Synthesizer

PAUSED = (
    "Anna, Emma, Olivia, Ella, Ava, Isla, Amelia.",
    "Only, ever, always, nowhere, maybe, yes.",
    "Lemon; mango; olive; almond; melon; onion.",
    "Rain, wind, snow, ice, and more rain!",
)
SPEEDS = (0.75, 1.0, 1.5)


def frame_checks(synth: Synthesizer, lines: list[str]) -> tuple[int, int, int, int]:
    """(words on a column change, words, sentences whose durations sum to T, sentences)."""
    on, words, summed, sentences = 0, 0, 0, 0
    params = SynthesisParams(noise_scale=0.0, noise_w=0.0)
    for line in lines:
        for sentence in synth.frontend.sentences(line, words=True):
            run = synth.engines.acoustic.run(np.asarray([sentence.ids]),
                                             params.scales(synth.engines))  # fmt: skip
            assert run.durations is not None, "these engines have no durations: recompile"
            z = run.latents[0]
            changes = {0} | {t for t in range(1, z.shape[1])
                             if not np.array_equal(z[:, t], z[:, t - 1])}  # fmt: skip
            bounds = np.concatenate([[0], np.cumsum(run.durations)])
            sentences += 1
            summed += int(bounds[-1]) == z.shape[1]
            for word in sentence.words:
                words += 1
                on += int(bounds[word.ids[0]]) in changes
    return on, words, summed, sentences


def onset_errors(synth: Synthesizer) -> list[int]:
    """Onset minus start, in frames, per word after a pause."""
    hop, rate, errors = synth.hop, synth.sample_rate, []
    for speed, text in itertools.product(SPEEDS, PAUSED):
        params = SynthesisParams(noise_scale=0.0, noise_w=0.0, speed=speed, timestamps=True)
        chunks = list(synth.stream(text, params))
        audio = np.concatenate([c.samples for c in chunks]).astype(np.float64) / 32767
        n = len(audio) // hop
        rms = np.sqrt(np.mean(audio[: n * hop].reshape(n, hop) ** 2, axis=1))
        quiet = 0.1 * rms.max()
        words = [w for c in chunks for w in c.words]
        for previous, word in itertools.pairwise(words):
            pause, start = round(previous.end * rate / hop), round(word.start * rate / hop)
            if start - pause < 2 or rms[pause:start].min() > quiet:
                continue  # no pause before it
            onset = pause
            while onset < n - 1 and rms[onset] <= quiet:
                onset += 1
            errors.append(onset - start)
    return errors


def front_end_ms(synth: Synthesizer, lines: list[str], rounds: int) -> tuple[float, float]:
    plain: list[float] = []
    timed: list[float] = []
    for _ in range(rounds):  # alternated, so machine noise hits both alike
        for words, out in ((False, plain), (True, timed)):
            started = time.perf_counter()
            for line in lines:
                synth.frontend.sentences(line, words=words)
            out.append(1000 * (time.perf_counter() - started) / len(lines))
    return statistics.median(plain), statistics.median(timed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--engines-dir", type=Path, default=Path("benchmarks/.cache/engines"))
    parser.add_argument("--corpus", type=Path, default=Path("benchmarks/corpus.txt"))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    version = ensure_default_voice(args.engines_dir, lambda msg: print(msg, flush=True))
    synth = Synthesizer(load_engine_set(version.path))
    lines = [x for x in args.corpus.read_text(encoding="utf-8").splitlines() if x.strip()]
    frame_s = 1000 * synth.hop / synth.sample_rate
    on, words, summed, sentences = frame_checks(synth, lines)
    errors = np.abs(np.asarray(onset_errors(synth)))
    plain, timed = front_end_ms(synth, lines, args.rounds)
    print("| figure | value |")
    print("|---|---|")
    print(f"| word starts on a phoneme's first frame | {on}/{words} words |")
    print(f"| durations sum to the latents' frames | {summed}/{sentences} sentences |")
    print(f"| onset error after pauses, mean | {errors.mean():.2f} frames = "
          f"{errors.mean() * frame_s:.1f} ms ({len(errors)} words, speeds {SPEEDS}) |")  # fmt: skip
    print(f"| onset error, median / p90 / max | {np.median(errors):.0f} / "
          f"{np.percentile(errors, 90):.0f} / {errors.max()} frames (1 frame = "
          f"{frame_s:.1f} ms) |")  # fmt: skip
    print(f"| onsets within 1 / 2 frames | {int((errors <= 1).sum())} / "
          f"{int((errors <= 2).sum())} of {len(errors)} |")  # fmt: skip
    print(f"| front end per corpus line, plain / with words | {plain:.2f} / {timed:.2f} ms |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
