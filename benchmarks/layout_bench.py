"""Convolution layout benchmark: each engine of the default voice with its 1-D convolutions as
they are, and lifted to 2-D ones (``ttsvc.compile.layout``), timed side by side.

Why this exists: ``ttsvc compile`` keeps the lifted layout of an engine only where a short
timing on the compiling machine says it is faster. This measures the two layouts over the sizes
a stream really runs (acoustic runs by phoneme ids, flow and vocoder windows by frames, context
included), so the compile's choice and its gain can be checked. Both layouts of an engine are
optimized exactly as the compile does and run on one ONNX Runtime intra-op thread, as a worker
runs them; each repetition runs the two back to back in alternating order, so a neighbour's load
slows both alike, and the figure of record is the median of the per-pair ratios.

Run from the repository root::

    python benchmarks/layout_bench.py
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent / "src"))

from bench_common import (  # noqa: E402
    fmt,
    machine_info,
    relative,
    utc_timestamp,
    write_atomic,
    write_json,
)
from ttsvc.backends.onnxruntime import create_session  # noqa: E402
from ttsvc.compile.build import default_checkpoint  # noqa: E402
from ttsvc.compile.inputs import load_piper_graph  # noqa: E402
from ttsvc.compile.layout import lift_convolutions, timing_feeds  # noqa: E402
from ttsvc.compile.optimize import optimize  # noqa: E402
from ttsvc.compile.split import split_model  # noqa: E402


def _sizes(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _feeds(name: str, model: onnx.ModelProto, size: int) -> dict[str, np.ndarray]:
    if name == "acoustic":  # ids spread over the voice's symbols, the length a sentence has
        return timing_feeds(model, [int(i) for i in np.arange(size) % 60 + 1])
    feeds = timing_feeds(model, [])
    return {k: np.resize(v, (*v.shape[:2], size)).astype(v.dtype) for k, v in feeds.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ids", default="10,25,50,100,200,400",
                        help="acoustic runs, phoneme ids")
    parser.add_argument("--frames", default="40,64,128,256,512",
                        help="flow and vocoder windows, frames including context")
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--json", type=Path, default=ROOT / "results" / "layout_bench.json")
    args = parser.parse_args()

    engines = split_model(load_piper_graph(default_checkpoint()[0]))
    graphs = {"acoustic": engines.acoustic, "flow": engines.flow, "vocoder": engines.vocoder}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, model in graphs.items():
            assert model is not None
            lifted, convs = lift_convolutions(model)
            paths = [Path(tmp) / f"{name}.onnx", Path(tmp) / f"{name}.2d.onnx"]
            optimize(model, paths[0])
            optimize(lifted, paths[1])
            sessions = [create_session(p, 1) for p in paths]
            for size in _sizes(args.ids if name == "acoustic" else args.frames):
                feeds = _feeds(name, model, size)
                outs = [s.run(None, feeds)[0] for s in sessions]  # also the first, allocating run
                times: list[list[float]] = [[], []]
                for rep in range(args.reps):
                    for which in ((0, 1) if rep % 2 == 0 else (1, 0)):
                        started = time.perf_counter()
                        sessions[which].run(None, feeds)
                        times[which].append(time.perf_counter() - started)
                ratios = [a / b for a, b in zip(times[0], times[1], strict=True)]
                rows.append({
                    "engine": name, "size": size, "lifted_convs": convs,
                    "conv1d_ms": 1e3 * float(np.median(times[0])),
                    "conv2d_ms": 1e3 * float(np.median(times[1])),
                    "speedup": float(np.median(ratios)),
                    "max_abs_diff": float(np.abs(outs[0] - outs[1]).max()),
                })  # fmt: skip
                r = rows[-1]
                print(f"{name:8s} {size:4d}  1-D {fmt(r['conv1d_ms'], 2):>7} ms  2-D "
                      f"{fmt(r['conv2d_ms'], 2):>7} ms  x{r['speedup']:.2f}  "
                      f"max diff {r['max_abs_diff']:.1e}", flush=True)  # fmt: skip

    lines = ["| engine | size | 1-D ms | 2-D ms | speedup (median of pairs) | max abs diff |",
             "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        unit = "ids" if r["engine"] == "acoustic" else "frames"
        lines.append(f"| {r['engine']} | {r['size']} {unit} | {fmt(r['conv1d_ms'], 2)} | "
                     f"{fmt(r['conv2d_ms'], 2)} | {r['speedup']:.2f} | "
                     f"{r['max_abs_diff']:.1e} |")  # fmt: skip
    table = "\n".join(lines)
    print(table)
    report = {"benchmark": "layout_bench", "when": utc_timestamp(),
              "machine": machine_info({"onnx": onnx.__version__}), "reps": args.reps,
              "rows": rows}  # fmt: skip
    write_json(args.json, report, clean_nan=False, newline=False)
    write_atomic(args.json.with_suffix(".md"), f"# Convolution layouts, side by side\n\n"
                 f"`python benchmarks/layout_bench.py` ({report['when']})\n\n{table}\n")
    print(f"wrote {relative(args.json)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
