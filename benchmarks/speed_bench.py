"""Speech length against the requested speed, before and after durations followed the speed.

Why this exists: VITS rounds every phoneme id's frames up, so each id (Piper's pads between
phonemes included) keeps at least one frame, and above speed ~2 speech stopped shortening
(issue 28). Since then the sentence engine divides the voice's speed-1 frame counts by the speed
above 1 (``ttsvc.compile.speed``). This measures the length of the same text at OpenAI's speeds
0.25-4 both ways, with noise 0 (every run gives the same audio) and no pause between sentences,
so the lengths are the speech alone:

* **before**: synthesized with ``--before-dir``, engines compiled before the change, when given;
  else the frames of Piper's own sentence graph (``split_model`` without the voice's length
  scale) times the hop, which is what those engines make, sample for sample;
* **after**: synthesized with ``--engines-dir`` (the default voice is compiled there if missing;
  its manifest must say ``speed_durations``).

At speed 1 and below the two must be the same audio; with ``--before-dir`` the table says
whether they are, to the bit. Run from the repository root::

    python benchmarks/speed_bench.py [--engines-dir DIR] [--before-dir DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent / "src"))

from bench_common import (  # noqa: E402
    DEFAULT_ENGINES,
    fmt,
    machine_info,
    markdown_table,
    relative,
    utc_timestamp,
    write_atomic,
    write_json,
)
from ttsvc.backends.loader import load_engine_set  # noqa: E402
from ttsvc.compile.build import default_checkpoint, ensure_default_voice  # noqa: E402
from ttsvc.compile.inputs import load_piper_graph  # noqa: E402
from ttsvc.compile.split import split_model  # noqa: E402
from ttsvc.config import DEFAULT_VOICE  # noqa: E402
from ttsvc.repository.layout import EngineRepository  # noqa: E402
from ttsvc.repository.manifest import load_manifest  # noqa: E402
from ttsvc.synthesis import SynthesisParams, Synthesizer  # noqa: E402

SPEEDS = (0.25, 0.5, 1.0, 2.0, 3.0, 4.0)
TEXT = ("The quick brown fox jumps over the lazy dog. Is this the right way to the station? "
        "Your order number is four, seven, two, nine.")  # fmt: skip


def _synth(directory: Path) -> tuple[Synthesizer, bool]:
    version = EngineRepository(directory).latest(DEFAULT_VOICE)
    if version is None:
        raise SystemExit(f"{directory}: no {DEFAULT_VOICE} engines")
    follows = load_manifest(version.path).speed_durations
    return Synthesizer(load_engine_set(version.path)), follows


def _audio(synth: Synthesizer, speed: float) -> np.ndarray:
    params = SynthesisParams(speed=speed, noise_scale=0.0, noise_w=0.0, sentence_silence=0.0)
    return np.asarray(synth.synthesize(TEXT, params))


def _piper_graph() -> ort.InferenceSession:
    """Piper's own sentence graph, as engines compiled before the change hold it."""
    acoustic = split_model(load_piper_graph(default_checkpoint()[0])).acoustic
    return ort.InferenceSession(acoustic.SerializeToString(), providers=["CPUExecutionProvider"])


def _piper_frames(piper: ort.InferenceSession, synth: Synthesizer, speed: float) -> int:
    """Frames of Piper's own sentence graph for ``TEXT`` at ``speed``: what engines compiled
    before the change make (the frame engines then make ``hop`` samples per frame)."""
    params = SynthesisParams(speed=speed, noise_scale=0.0, noise_w=0.0)
    frames = 0
    for sentence in synth.sentences(TEXT):
        ids = np.asarray([sentence.ids], dtype=np.int64)
        out = piper.run(None, {"input": ids, "input_lengths": np.asarray([ids.shape[1]]),
                               "scales": params.scales(synth.engines)})  # fmt: skip
        frames += int(np.asarray(out[0]).shape[2])
    return frames


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines-dir", type=Path, default=DEFAULT_ENGINES)
    parser.add_argument("--before-dir", type=Path, default=None,
                        help="engines compiled before durations followed the speed")
    parser.add_argument("--json", type=Path, default=ROOT / "results" / "speed_bench.json")
    args = parser.parse_args()

    ensure_default_voice(args.engines_dir, lambda msg: print(msg, flush=True))
    after, follows = _synth(args.engines_dir)
    if not follows:
        raise SystemExit(f"{args.engines_dir}: compiled before durations followed the speed "
                         "(manifest speed_durations false): recompile, or use another directory")
    before = _synth(args.before_dir)[0] if args.before_dir is not None else None
    piper = _piper_graph() if before is None else None
    rate = after.sample_rate
    rows: list[dict[str, Any]] = []
    for speed in SPEEDS:
        new = _audio(after, speed)
        row: dict[str, Any] = {"speed": speed, "after_s": len(new) / rate}
        if before is not None:
            old = _audio(before, speed)
            row["before_s"] = len(old) / rate
            row["identical"] = bool(len(old) == len(new) and np.array_equal(old, new))
        else:
            assert piper is not None
            row["before_s"] = _piper_frames(piper, after, speed) * after.hop / rate
        rows.append(row)
        print(f"speed {speed:4}: before {row['before_s']:.2f} s, after {row['after_s']:.2f} s",
              flush=True)  # fmt: skip
    at_1 = {k: next(r[k] for r in rows if r["speed"] == 1.0) for k in ("before_s", "after_s")}
    for row in rows:
        row["before_x"] = at_1["before_s"] / row["before_s"]
        row["after_x"] = at_1["after_s"] / row["after_s"]

    header = ["speed", "before s", "before: faster than speed 1", "after s",
              "after: faster than speed 1"]  # fmt: skip
    if before is not None:
        header.append("same audio as before")
    cells = []
    for r in rows:
        line = [f"{r['speed']:g}", fmt(r["before_s"], 2), f"{r['before_x']:.2f}x",
                fmt(r["after_s"], 2), f"{r['after_x']:.2f}x"]  # fmt: skip
        if before is not None:
            line.append("yes" if r["identical"] else "no")
        cells.append(line)
    table = markdown_table(header, "r" * len(header), cells)
    how = ("synthesized with engines compiled before the change" if before is not None
           else "frames of Piper's own sentence graph times the hop")  # fmt: skip
    print(table)
    report = {"benchmark": "speed_bench", "when": utc_timestamp(),
              "machine": machine_info({"onnxruntime": ort.__version__}),
              "text": TEXT, "before": how, "rows": rows}  # fmt: skip
    write_json(args.json, report)
    write_atomic(args.json.with_suffix(".md"), f"# Speech length against speed\n\n"
                 f"`python benchmarks/speed_bench.py` ({report['when']}, "
                 f"{report['machine']['cpu_model']}); before: {how}; noise 0, no pause between "
                 f"sentences.\n\n{table}\n")  # fmt: skip
    print(f"wrote {relative(args.json)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
