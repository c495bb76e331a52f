"""Engine-level latency benchmark: one-shot vs streamed synthesis, and engine-set load time.

Why this exists: the service promises audio early (small first vocoder window) without paying
much throughput for it (overlap context around each window), and fast worker start (engines are
pre-optimized so session creation is cheap). Those claims are ratios between variants of the same
work, so every variant is measured side by side in the same process and the same run: for each
sentence and repeat, the one-shot run and one streamed run per window schedule are interleaved,
in a rotating order, so drift on a shared machine (other tenants, thermal, frequency) lands on
all variants alike instead of on whichever ran last.

This is a benchmark, not a test: it prints a markdown table with targets and writes every raw
per-sentence number to JSON; it never fails on a missed target.

Run from the repository root::

    python benchmarks/engine_bench.py
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from bench_common import (
    DEFAULT_CORPUS,
    DEFAULT_ENGINES,
    RESULTS,
    load_corpus,
    machine_info,
    pct,
    relative,
    utc_timestamp,
    write_json,
)
from ttsvc.backends.base import StreamCarry, StreamingEngine
from ttsvc.backends.loader import load_engine_set
from ttsvc.backends.onnxruntime import create_session
from ttsvc.compile.build import ensure_default_voice
from ttsvc.repository.manifest import load_manifest, verify_files
from ttsvc.synthesis import SynthesisParams, Synthesizer, to_pcm16
from ttsvc.synthesis.steps import FrameCall
from ttsvc.windows import WindowSchedule

DEFAULT_JSON = RESULTS / "engine_bench.json"

TARGET_FIRST_CHUNK_MS = 25.0
"""Median engine-level time to first chunk (from the start of ``latents()``)."""
TARGET_STREAM_COST_PCT = 10.0
"""Extra compute of streaming over one-shot, ratio of sums over the sampled sentences."""
TARGET_LOAD_MS = 100.0
"""Median wall time of one ``load_engine_set`` call (verify + create both sessions)."""

ONE_SHOT = "one-shot"
PCM_FULL_SCALE = 32767.0

Stats = dict[str, float]


# --------------------------------------------------------------------------- inputs


def _where(path: Path) -> str:
    """An engine version as ``<root>/<voice>/<version>``: enough to tell two sets apart, and no
    absolute path of the machine it ran on in the results."""
    return "/".join(path.parts[-3:])


def parse_schedules(spec: str) -> dict[str, WindowSchedule]:
    """``"8:2:128,4:2:128"`` (first:growth:max frames) to schedules keyed by their spelling."""
    schedules: dict[str, WindowSchedule] = {}
    for item in spec.split(","):
        label = item.strip()
        if not label:
            continue
        parts = label.split(":")
        if len(parts) != 3:
            raise SystemExit(f"--schedules: {label!r} is not first:growth:max")
        schedules[label] = WindowSchedule(int(parts[0]), float(parts[1]), int(parts[2]))
    if not schedules:
        raise SystemExit("--schedules: need at least one schedule")
    return schedules


def parse_batches(spec: str) -> list[int]:
    """``"1,2,4,8"`` to batch sizes (``""``: none, the batch measurement is skipped)."""
    try:
        sizes = sorted({int(item) for item in spec.split(",") if item.strip()})
    except ValueError:
        raise SystemExit(f"--batches: {spec!r} is not a list of integers") from None
    if any(size < 1 for size in sizes):
        raise SystemExit("--batches: batch sizes start at 1")
    if sizes and sizes[0] != 1:
        sizes.insert(0, 1)  # every ratio is against batch 1
    return sizes


# --------------------------------------------------------------------------- statistics


def ms(seconds: float) -> float:
    """Seconds to milliseconds, rounded to what perf_counter resolves meaningfully here."""
    return round(seconds * 1000.0, 4)


def stats(values: Sequence[float]) -> Stats:
    """Median and p90 (numpy's linear interpolation) plus the sample count."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return {"median": float("nan"), "p90": float("nan"), "n": 0}
    return {
        "median": float(np.median(arr)),
        "p90": pct(arr, 90),
        "n": int(arr.size),
    }


# --------------------------------------------------------------------------- engine-set load


def bench_load(path: Path, threads: int, loads: int) -> dict[str, list[float]]:
    """Time ``loads`` fresh engine-set loads and, separately, their two parts.

    ``load_engine_set`` does both parts inside one call, so the parts are timed by calling the
    same functions it calls (``load_manifest`` + ``verify_files``; ``create_session`` on every
    engine, one after another) in their own calls; ``load_engine_set`` itself runs the engines
    side by side on two threads. The three measurements rotate order each round so none always
    gets the warmest cache. Files are in the page cache (the run has just read or built them):
    this is a warm worker restart, not a cold node.
    """
    engine_files = [n for n in load_manifest(path).files if n.endswith(".onnx")]
    steps: dict[str, Callable[[], object]] = {
        "verify_ms": lambda: verify_files(path, load_manifest(path)),
        "sessions_ms": lambda: [create_session(path / name, threads) for name in engine_files],
        "load_engine_set_ms": lambda: load_engine_set(path, threads),
    }
    times: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    for round_ in range(loads):
        for name in names[round_ % 3 :] + names[: round_ % 3]:
            gc.collect()
            start = time.perf_counter()
            result = steps[name]()
            times[name].append(ms(time.perf_counter() - start))
            del result  # sessions are freed before the next load, as in a fresh worker
    return times


# --------------------------------------------------------------------------- synthesis runs


class StreamProbe:
    """Timestamps taken inside ``Synthesizer.stream`` without changing what it computes.

    ``stream()`` runs the front end, then answers each engine call its steps ask for with
    ``run_call`` (the acoustic run, then flow and vocoder windows). To split its time into
    front end / engine and to time the first window, the probe wraps the instance's
    ``run_call`` while a streamed run is measured; the wrapper adds two ``perf_counter`` calls
    per engine call (microseconds).
    """

    def __init__(self, synth: Synthesizer) -> None:
        self.synth = synth
        self.latents_start: float | None = None
        self.latents_end: float | None = None
        self.first_window: float | None = None

    def reset(self) -> None:
        """Forget the previous run's timestamps."""
        self.latents_start = self.latents_end = self.first_window = None

    @contextmanager
    def installed(self) -> Iterator[StreamProbe]:
        """Wrap the synthesizer's ``run_call`` for the duration of the block, then restore it."""
        original = self.synth.run_call

        def run_call(call: FrameCall) -> Any:
            if call.stage == "acoustic" and self.latents_start is None:
                self.latents_start = time.perf_counter()
            out = original(call)
            if call.stage == "acoustic" and self.latents_end is None:
                self.latents_end = time.perf_counter()
            if call.stage == "vocoder" and self.first_window is None:
                self.first_window = time.perf_counter()
            return out

        self.synth.run_call = run_call  # type: ignore[method-assign]
        try:
            yield self
        finally:
            del self.synth.run_call  # an instance attribute: the class method shows through


def run_one_shot(
    synth: Synthesizer, text: str, params: SynthesisParams
) -> tuple[dict[str, float], np.ndarray]:
    """Front end, then the whole sentence through each engine once (what ``one_shot`` does).

    ``one_shot`` is ``vocoder.waveform(frames(latents(...)))``; calling the stages here keeps
    the same work while timing each (``frames`` is the flow, when the engine set has one).
    PCM16 conversion is included in the engine total because the streamed path includes it
    too, so the two totals compare like for like.
    """
    t0 = time.perf_counter()
    sentence = synth.sentences(text)[0]
    t1 = time.perf_counter()
    latents = synth.latents(sentence.ids, params)
    t2 = time.perf_counter()
    frames = synth.frames(latents)
    t2f = time.perf_counter()
    audio = synth.engines.vocoder.waveform(frames)
    t3 = time.perf_counter()
    pcm = to_pcm16(audio)
    t4 = time.perf_counter()
    audio_s = len(pcm) / synth.sample_rate
    record = {
        "frontend_ms": ms(t1 - t0),
        "acoustic_ms": ms(t2 - t1),
        "flow_ms": ms(t2f - t2),
        "vocoder_ms": ms(t3 - t2f),
        "engine_total_ms": ms(t4 - t1),
        "total_ms": ms(t4 - t0),
        "audio_s": audio_s,
        "rtf": (t4 - t1) / audio_s,
        "frames": int(latents.shape[2]),
    }
    return record, pcm


def run_streamed(
    synth: Synthesizer,
    probe: StreamProbe,
    text: str,
    params: SynthesisParams,
    schedule: WindowSchedule,
) -> tuple[dict[str, float], np.ndarray]:
    """One ``stream()`` run, timed from the call (front end included) and from ``latents()``."""
    probe.reset()
    pieces: list[np.ndarray] = []
    with probe.installed():
        t0 = time.perf_counter()
        chunks = synth.stream(text, params, schedule)
        first = next(chunks)
        t_first = time.perf_counter()
        pieces.append(first.samples)
        for chunk in chunks:  # bounded: one chunk per window of a finite sentence
            pieces.append(chunk.samples)
        t_end = time.perf_counter()
    assert probe.latents_start is not None
    assert probe.latents_end is not None
    assert probe.first_window is not None
    pcm = np.concatenate(pieces)
    audio_s = len(pcm) / synth.sample_rate
    engine_total = t_end - probe.latents_start
    record = {
        "frontend_ms": ms(probe.latents_start - t0),
        "acoustic_ms": ms(probe.latents_end - probe.latents_start),
        "first_window_engine_ms": ms(probe.first_window - probe.latents_start),
        "first_chunk_engine_ms": ms(t_first - probe.latents_start),
        "first_chunk_total_ms": ms(t_first - t0),
        "engine_total_ms": ms(engine_total),
        "total_ms": ms(t_end - t0),
        "audio_s": audio_s,
        "rtf": engine_total / audio_s,
        "chunks": len(pieces),
    }
    return record, pcm


def max_abs_diff(reference: np.ndarray, other: np.ndarray) -> float:
    """Largest sample difference in PCM16 steps; a length mismatch counts as full scale."""
    if reference.shape != other.shape:
        return 2.0 * PCM_FULL_SCALE
    return float(np.max(np.abs(reference.astype(np.int32) - other.astype(np.int32))))


def bench_synthesis(
    synth: Synthesizer,
    texts: list[str],
    *,
    schedules: dict[str, WindowSchedule],
    params: SynthesisParams,
    repeat: int,
    warmup: list[str],
    synth_of: dict[str, Synthesizer] | None = None,
) -> list[dict[str, Any]]:
    """Per sentence: ``repeat`` rounds of one-shot plus every schedule, in rotating order.

    ``synth_of`` names the schedules streamed on another engine set (``--compare-dir``): they
    are timed in the same rotation, against the same one-shot runs of ``synth``.
    GC is collected before and disabled during a sentence's runs so a collection pause does not
    land on one variant's millisecond-scale timing.
    """
    synth_of = synth_of or {}
    probes = {id(s): StreamProbe(s) for s in [synth, *synth_of.values()]}
    variants = [ONE_SHOT, *schedules]

    def run(variant: str, text: str) -> tuple[dict[str, float], np.ndarray]:
        if variant == ONE_SHOT:
            return run_one_shot(synth, text, params)
        streaming = synth_of.get(variant, synth)
        return run_streamed(streaming, probes[id(streaming)], text, params, schedules[variant])

    for text in warmup:  # first runs allocate ORT arenas and fill caches; not measured
        for variant in variants:
            run(variant, text)

    records: list[dict[str, Any]] = []
    started = time.perf_counter()
    for index, text in enumerate(texts):
        runs: dict[str, list[dict[str, float]]] = {variant: [] for variant in variants}
        diffs: dict[str, float] = {label: 0.0 for label in schedules}
        gc.collect()
        gc.disable()
        try:
            for rep in range(repeat):
                shift = (index * repeat + rep) % len(variants)
                outputs: dict[str, np.ndarray] = {}
                for variant in variants[shift:] + variants[:shift]:
                    record, pcm = run(variant, text)
                    runs[variant].append(record)
                    outputs[variant] = pcm
                reference = outputs[ONE_SHOT]
                for label in schedules:
                    diffs[label] = max(diffs[label], max_abs_diff(reference, outputs[label]))
        finally:
            gc.enable()
        one_shot_total = float(np.median([r["engine_total_ms"] for r in runs[ONE_SHOT]]))
        streamed: dict[str, Any] = {}
        for label in schedules:
            total = float(np.median([r["engine_total_ms"] for r in runs[label]]))
            streamed[label] = {
                "runs": runs[label],
                "median_engine_total_ms": total,
                "cost_pct": 100.0 * (total / one_shot_total - 1.0),
                "max_abs_diff_pcm16": diffs[label],
            }
        records.append(
            {
                "text": text,
                "chars": len(text),
                "audio_s": runs[ONE_SHOT][0]["audio_s"],
                "one_shot": {"runs": runs[ONE_SHOT], "median_engine_total_ms": one_shot_total},
                "streamed": streamed,
            }
        )
        elapsed = time.perf_counter() - started
        print(f"  [{index + 1}/{len(texts)}] {elapsed:6.1f} s  {text}", file=sys.stderr)
    return records


# --------------------------------------------------------------------------- summary


def summarize(
    records: list[dict[str, Any]],
    schedules: dict[str, WindowSchedule],
    load: dict[str, list[float]],
) -> dict[str, Any]:
    """Latency distributions over every (sentence, repeat) run; costs from per-sentence medians.

    The streaming cost is aggregated as a ratio of sums (total streamed engine time over total
    one-shot engine time, each a per-sentence median) so long sentences weigh by their compute,
    as they do on a busy worker; the per-sentence distribution is kept alongside.
    """

    def pooled(runs_of: Callable[[dict[str, Any]], list[dict[str, float]]], key: str) -> Stats:
        return stats([run[key] for record in records for run in runs_of(record)])

    def one_shot_runs(record: dict[str, Any]) -> list[dict[str, float]]:
        return record["one_shot"]["runs"]  # type: ignore[no-any-return]

    frontend = [
        run["frontend_ms"]
        for record in records
        for run in [*record["one_shot"]["runs"]]
        + [r for label in schedules for r in record["streamed"][label]["runs"]]
    ]
    summary: dict[str, Any] = {
        "sentences": len(records),
        "audio_s_total": float(sum(r["audio_s"] for r in records)),
        "frontend_ms": stats(frontend),
        "one_shot": {
            key: pooled(one_shot_runs, key)
            for key in (
                "acoustic_ms",
                "flow_ms",
                "vocoder_ms",
                "engine_total_ms",
                "total_ms",
                "rtf",
            )
        },
        "streamed": {},
        "load": {name: stats(values) for name, values in load.items()},
    }
    one_shot_sum = sum(r["one_shot"]["median_engine_total_ms"] for r in records)
    for label in schedules:

        def streamed_runs(record: dict[str, Any], label: str = label) -> list[dict[str, float]]:
            return record["streamed"][label]["runs"]  # type: ignore[no-any-return]

        streamed_sum = sum(r["streamed"][label]["median_engine_total_ms"] for r in records)
        summary["streamed"][label] = {
            **{
                key: pooled(streamed_runs, key)
                for key in (
                    "first_window_engine_ms",
                    "first_chunk_engine_ms",
                    "first_chunk_total_ms",
                    "engine_total_ms",
                    "total_ms",
                    "rtf",
                    "chunks",
                )
            },
            "cost_pct_ratio_of_sums": 100.0 * (streamed_sum / one_shot_sum - 1.0),
            "cost_pct_per_sentence": stats([r["streamed"][label]["cost_pct"] for r in records]),
            "max_abs_diff_pcm16": max(r["streamed"][label]["max_abs_diff_pcm16"] for r in records),
        }
    return summary


def table_rows(summary: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """(metric, median, p90, target, result) rows; result is pass/miss where a target exists."""

    def verdict(value: float, limit: float) -> str:
        return "pass" if value <= limit else "miss"

    def fmt(s: Stats, unit: str = " ms", digits: int = 1) -> tuple[str, str]:
        return f"{s['median']:.{digits}f}{unit}", f"{s['p90']:.{digits}f}{unit}"

    rows: list[tuple[str, str, str, str, str]] = []
    rows.append(("front end (text → ids)", *fmt(summary["frontend_ms"], digits=2), "", ""))
    one = summary["one_shot"]
    rows.append(("one-shot: acoustic engine", *fmt(one["acoustic_ms"]), "", ""))
    rows.append(("one-shot: flow, whole sentence", *fmt(one["flow_ms"]), "", ""))
    rows.append(("one-shot: vocoder, whole sentence", *fmt(one["vocoder_ms"]), "", ""))
    rows.append(("one-shot: engine total (= time to audio)", *fmt(one["engine_total_ms"]), "", ""))
    rows.append(("one-shot: RTF (engine total / audio s)", *fmt(one["rtf"], "", 3), "", ""))
    for label, s in summary["streamed"].items():
        first = s["first_chunk_engine_ms"]
        rows.append(
            (
                f"stream {label}: first chunk, engine level",
                *fmt(first),
                f"≤ {TARGET_FIRST_CHUNK_MS:.0f} ms median",
                verdict(first["median"], TARGET_FIRST_CHUNK_MS),
            )
        )
        rows.append(
            (
                f"stream {label}: first chunk, incl. front end",
                *fmt(s["first_chunk_total_ms"]),
                "",
                "",
            )
        )
        rows.append(
            (
                f"stream {label}: first window computed (no look-ahead)",
                *fmt(s["first_window_engine_ms"]),
                "",
                "",
            )
        )
        rows.append((f"stream {label}: engine total", *fmt(s["engine_total_ms"]), "", ""))
        rows.append((f"stream {label}: RTF", *fmt(s["rtf"], "", 3), "", ""))
        cost = s["cost_pct_ratio_of_sums"]
        per = s["cost_pct_per_sentence"]
        rows.append(
            (
                f"stream {label}: cost vs one-shot (ratio of sums; p90 per sentence)",
                f"{cost:+.1f} %",
                f"{per['p90']:+.1f} %",
                f"≤ {TARGET_STREAM_COST_PCT:.0f} %",
                verdict(cost, TARGET_STREAM_COST_PCT),
            )
        )
        rows.append(
            (
                f"stream {label}: max abs diff vs one-shot (PCM16 steps, all runs)",
                f"{s['max_abs_diff_pcm16']:.0f}",
                "",
                "",
                "",
            )
        )
    load = summary["load"]
    rows.append(("load: verify (manifest + sha256)", *fmt(load["verify_ms"]), "", ""))
    rows.append(("load: create both sessions", *fmt(load["sessions_ms"]), "", ""))
    total = load["load_engine_set_ms"]
    rows.append(
        (
            "load: load_engine_set total",
            *fmt(total),
            f"≤ {TARGET_LOAD_MS:.0f} ms median",
            verdict(total["median"], TARGET_LOAD_MS),
        )
    )
    return rows


def render(summary: dict[str, Any], machine: dict[str, Any], settings: dict[str, Any]) -> str:
    """The markdown printed to stdout: machine header, settings, then the table."""
    cpu = machine["cpu_model"] or machine["processor"] or machine["machine"]
    lines = [
        "## ttsvc engine benchmark",
        "",
        f"- machine: {cpu} ({machine['machine']}), {machine['cpu_count']} CPUs, "
        f"{machine['platform']}",
        f"- python {machine['python']}, onnxruntime {machine['onnxruntime']}, "
        f"numpy {machine['numpy']}",
        f"- {summary['sentences']} sentences x {settings['repeat']} repeats "
        f"({summary['audio_s_total']:.1f} s of audio per variant), ORT threads "
        f"{settings['threads']}, noise 0, seed {settings['seed']}, "
        f"{settings['loads']} engine-set loads",
        f"- engines: {settings['engines']} ({settings['streaming']}; one-shot runs on these)"
        + ("" if not settings.get("compared") else f"; compared: {settings['compared']['engines']}"
           f" ({settings['compared']['streaming']}), its streamed runs labelled so"),
        "",
        "| metric | median | p90 | target | result |",
        "|---|---|---|---|---|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(summary)]
    return "\n".join(lines)


def checks(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The targeted rows in machine-readable form for the JSON."""
    return [
        {"metric": row[0], "value": row[1], "target": row[3], "result": row[4]}
        for row in table_rows(summary)
        if row[4]
    ]


# --------------------------------------------------------------------------- batching


def bench_batches(synth: Synthesizer, sizes: Sequence[int], widths: Sequence[int],
                  rounds: int) -> dict[str, Any]:  # fmt: skip
    """Per stage (flow, vocoder) and window width, one stateful window for ``B`` streams in one
    call, for each ``B`` in ``sizes``: what cross-stream batching would buy on this CPU (issue
    40: measure batch 1, 2, 4 and 8 on the engine before the scheduler batches).

    Each call runs from a zero state at position 0 (the graphs take one position for the whole
    batch: enough to price the work, which is the same at any position inside a sentence).
    The sizes rotate order every round, so drift lands on all alike. Reported per size: the
    call's median ms, the median µs per stream-frame, and that over batch 1's (below 1: a
    batch computes a stream's frame for less)."""
    engines = {"flow": synth.engines.flow, "vocoder": synth.engines.vocoder}
    channels = synth.engines.manifest.latent_channels  # the flow's and the vocoder's input
    out: dict[str, Any] = {}
    rng = np.random.default_rng(0)
    for stage, engine in engines.items():
        if not isinstance(engine, StreamingEngine):
            out[stage] = {"skipped": "not a stateful engine"}
            continue
        out[stage] = {}
        for width in widths:
            inputs = {b: (rng.standard_normal((b, channels, width)) * 0.3).astype(np.float32)
                      for b in sizes}  # fmt: skip
            timings: dict[int, list[float]] = {b: [] for b in sizes}
            for b in sizes:  # warm each shape once: ONNX Runtime plans per shape
                engine.step(inputs[b], StreamCarry(10**6))
            for index in range(rounds):
                turn = index % len(sizes)
                for b in [*sizes[turn:], *sizes[:turn]]:
                    started = time.perf_counter()
                    engine.step(inputs[b], StreamCarry(10**6))
                    timings[b].append(time.perf_counter() - started)
            base = float(np.median(timings[sizes[0]])) / (sizes[0] * width)
            out[stage][str(width)] = {
                str(b): {
                    "call_ms": ms(float(np.median(t))),
                    "us_per_stream_frame": round(1e6 * float(np.median(t)) / (b * width), 2),
                    "vs_batch_1": round(float(np.median(t)) / (b * width) / base, 3),
                }
                for b, t in timings.items()
            }
    return {"widths_frames": list(widths), "rounds": rounds, "stages": out}


def batch_rows(batches: dict[str, Any]) -> list[str]:
    """The batch measurement as its own markdown table."""
    lines = [
        "",
        f"Cross-stream batches, stateful engines, {batches['rounds']} rounds (median):",
        "",
        "| stage | window frames | batch | call ms | µs per stream-frame | vs batch 1 |",
        "|---|---|---|---|---|---|",
    ]
    for stage, by_width in batches["stages"].items():
        if "skipped" in by_width:
            lines.append(f"| {stage} | — | — | — | — | {by_width['skipped']} |")
            continue
        for width, sizes in by_width.items():
            for b, row in sizes.items():
                per_frame, ratio = row["us_per_stream_frame"], row["vs_batch_1"]
                lines.append(f"| {stage} | {width} | {b} | {row['call_ms']:.2f} | "
                             f"{per_frame:.0f} | {ratio:.2f} |")  # fmt: skip
    return lines


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Flags; every default is what the README's figures were produced with."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--engines-dir",
        type=Path,
        default=DEFAULT_ENGINES,
        help="engine repository; the default voice is compiled here if missing",
    )
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--threads", type=int, default=1, help="ORT intra-op threads per session")
    parser.add_argument("--n", type=int, default=40, help="sentences sampled from the corpus")
    parser.add_argument("--seed", type=int, default=1234, help="seed of the sentence sample")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per sentence")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured warm-up sentences")
    parser.add_argument("--loads", type=int, default=10, help="engine-set loads timed")
    parser.add_argument(
        "--schedules",
        default="8:8:512,8:2:128,16:8:512",
        help="comma-separated first:growth:max frame window schedules",
    )
    parser.add_argument("--compare-dir", type=Path, default=None,
                        help="another engines directory (e.g. --streaming context engines): "
                        "its streamed runs join the same rotation, against the same one-shot "
                        "runs of --engines-dir")  # fmt: skip
    parser.add_argument("--batches", default="1,2,4,8",
                        help="cross-stream batch sizes to time on the stateful flow and vocoder "
                        "('' to skip)")  # fmt: skip
    parser.add_argument("--batch-widths", default="32,128",
                        help="frames per window in the batch measurement (comma-separated)")
    parser.add_argument("--batch-rounds", type=int, default=20,
                        help="rounds of the batch measurement")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write results")
    args = parser.parse_args(argv)
    for name in ("threads", "n", "repeat", "loads", "batch_rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must be at least 0")
    try:
        args.batch_widths = [int(w) for w in args.batch_widths.split(",") if w.strip()]
    except ValueError:
        parser.error(f"--batch-widths: {args.batch_widths!r} is not a list of integers")
    if not args.batch_widths or min(args.batch_widths) < 1:
        parser.error("--batch-widths: at least one width, each at least 1 frame")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Build or reuse the engines, measure, print the table, write the JSON."""
    args = parse_args(argv)
    schedules = parse_schedules(args.schedules)
    corpus = load_corpus(args.corpus)
    if args.n > len(corpus):
        raise SystemExit(f"--n {args.n}: the corpus has only {len(corpus)} lines")
    rng = random.Random(args.seed)
    texts = rng.sample(corpus, args.n)
    rest = [line for line in corpus if line not in texts]
    warmup = rng.sample(rest, min(args.warmup, len(rest)))

    def log(message: str) -> None:
        print(message, file=sys.stderr)

    version = ensure_default_voice(args.engines_dir, log)
    log(f"engines: {version.path}")

    log(f"timing {args.loads} engine-set loads")
    load = bench_load(version.path, args.threads, args.loads)

    synth = Synthesizer(load_engine_set(version.path, args.threads))
    synth.calibrate()  # as a worker does: windows are capped to playback
    synth_of: dict[str, Synthesizer] = {}
    compared = None
    if args.compare_dir is not None:
        compared = ensure_default_voice(args.compare_dir, log)
        other = Synthesizer(load_engine_set(compared.path, args.threads))
        other.calibrate()
        kind = other.engines.manifest.streaming
        for label, schedule in list(schedules.items()):
            schedules[f"{label} {kind}"] = schedule
            synth_of[f"{label} {kind}"] = other
    for text in texts + warmup:  # the per-sentence comparison assumes one engine run per line
        count = len(synth.sentences(text))
        if count != 1:
            raise SystemExit(f"corpus line is {count} sentences, want 1: {text!r}")
    params = SynthesisParams(noise_scale=0.0, noise_w=0.0)
    log(f"synthesis: {len(texts)} sentences x {args.repeat} x {1 + len(schedules)} variants")
    started = time.perf_counter()
    records = bench_synthesis(
        synth, texts, schedules=schedules, params=params, repeat=args.repeat, warmup=warmup,
        synth_of=synth_of,
    )
    duration = time.perf_counter() - started
    batches = None
    if sizes := parse_batches(args.batches):
        widths = args.batch_widths
        log(f"batches {sizes}: {args.batch_rounds} rounds of {widths}-frame windows")
        # the stateful set, whichever side of the comparison it is on
        stateful = next((s for s in [synth, *synth_of.values()] if s.stateful), synth)
        batches = bench_batches(stateful, sizes, widths, args.batch_rounds)

    summary = summarize(records, schedules, load)
    machine = machine_info({"onnxruntime": ort.__version__, "numpy": np.__version__})
    settings = {
        "threads": args.threads,
        "n": args.n,
        "seed": args.seed,
        "repeat": args.repeat,
        "warmup": args.warmup,
        "loads": args.loads,
        "schedules": {
            label: {"first": s.first, "growth": s.growth, "max": s.max}
            for label, s in schedules.items()
        },
        "params": params.model_dump(),
        "engines": _where(version.path),
        "streaming": synth.engines.manifest.streaming,
        "compared": None if compared is None else {
            "engines": _where(compared.path),
            "streaming": next(iter(synth_of.values())).engines.manifest.streaming,
        },
        "contexts": {k: v.model_dump() for k, v in synth.engines.manifest.contexts.items()},
        "sample_rate": synth.sample_rate,
        "hop_length": synth.hop,
        "corpus": relative(args.corpus),
    }
    print(render(summary, machine, settings))
    if batches is not None:
        print("\n".join(batch_rows(batches)))

    document = {
        "date": utc_timestamp(),
        "machine": machine,
        "settings": settings,
        "targets": {
            "first_chunk_engine_ms_median": TARGET_FIRST_CHUNK_MS,
            "stream_cost_pct": TARGET_STREAM_COST_PCT,
            "load_engine_set_ms_median": TARGET_LOAD_MS,
        },
        "duration_s": duration,
        "summary": summary,
        "checks": checks(summary),
        "load_raw_ms": load,
        "batches": batches,
        "sentences": records,
    }
    write_json(args.json, document, clean_nan=False, ensure_ascii=False)
    log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
