"""Encoder cost: gateway CPU time per second of audio, per output format and rate.

Encodes real speech from the default voice (synthesized once, resampled with soxr to each rate)
in worker-sized chunks through ``ttsvc.audio.encode``, streamed (FLAC whole), as the gateway
does. Prints a markdown table; ``--json`` also writes the numbers. Run from the repository root:

    python benchmarks/encode_bench.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import soxr

from bench_common import write_json
from ttsvc.audio.encode import FORMATS, Encoder
from ttsvc.backends.loader import load_engine_set
from ttsvc.compile.build import ensure_default_voice
from ttsvc.synthesis import SynthesisParams, Synthesizer

TEXT = 3 * (
    "The encoder turns each chunk of speech into bytes as soon as it arrives. "
    "A listener on a phone line, a browser tab or a voice bot hears it at once. "
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--engines-dir", type=Path, default=Path("benchmarks/.cache/engines"))
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    version = ensure_default_voice(args.engines_dir, lambda m: print(m, file=sys.stderr))
    synth = Synthesizer(load_engine_set(version.path))
    speech = synth.synthesize(TEXT, SynthesisParams(noise_scale=0.0, noise_w=0.0))
    seconds = len(speech) / synth.sample_rate
    rows = []
    for name, fmt in FORMATS.items():
        for rate in fmt.rates:
            pcm = soxr.resample(speech, synth.sample_rate, rate, quality="HQ")
            step = int(0.5 * rate)
            chunks = [pcm[i : i + step].tobytes() for i in range(0, len(pcm), step)]
            costs, size = [], 0
            for _ in range(args.repeat):
                encoder = Encoder(fmt, rate, streamed=fmt.streams)
                started = time.perf_counter()
                size = sum(len(encoder.encode(c)) for c in chunks) + len(encoder.finish())
                costs.append(time.perf_counter() - started)
            ms = 1000 * statistics.median(costs) / seconds
            rows.append({"format": name, "rate": rate, "ms_per_audio_s": round(ms, 3),
                         "kbit_per_s": round(8 * size / seconds / 1000, 1)})  # fmt: skip
    print(f"{seconds:.1f} s of speech, median of {args.repeat}\n")
    print("| format | rate | encode ms per audio s | kbit/s |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['format']} | {r['rate']} | {r['ms_per_audio_s']:.2f} | {r['kbit_per_s']} |")
    if args.json is not None:
        write_json(args.json, {"audio_s": seconds, "rows": rows}, clean_nan=False, newline=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
