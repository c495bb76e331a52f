"""Step-cost benchmark: what one scheduler step costs, engine by engine and around the engines.

Why this exists: a deadline scheduler can only bound its steps if it knows what a step costs.
The acoustic engine runs once per sentence and cannot be windowed, so its cost as a function of
phoneme ids says which sentences are too long to run in one step; the flow and vocoder cost as a
function of window width (contexts included) says how small a window may get before its overlap
dominates; the fixed costs around each step (pickling the chunk message for the pipe, the
scheduler's own Python) say what every extra step costs; and two compute threads running
vocoder windows from one process side by side with one thread say whether K threads over one
queue scale on this machine's cores (ONNX Runtime releases the GIL inside ``run``).

Everything runs on one ONNX Runtime intra-op thread per session, as a worker does. Times are
medians of several repetitions; variants are interleaved in rotating order so drift on a shared
machine lands on all of them alike. This is a benchmark, not a test: it prints a markdown table
and writes every raw number to JSON.

Run from the repository root::

    python benchmarks/step_bench.py
"""

from __future__ import annotations

import argparse
import gc
import os
import pickle
import sys
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing import Pipe
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from bench_common import (
    DEFAULT_CORPUS,
    DEFAULT_ENGINES,
    RESULTS,
    fmt,
    load_corpus,
    machine_info,
    pct,
    relative,
    utc_timestamp,
    write_atomic,
    write_json,
)
from ttsvc.backends.loader import load_engine_set
from ttsvc.compile.build import ensure_default_voice
from ttsvc.observability.logs import configure_logging
from ttsvc.protocol import AudioChunkMsg, FromWorker, StreamDone, StreamError, SynthesisJob
from ttsvc.synthesis import SynthesisParams, Synthesizer, to_pcm16
from ttsvc.worker.deadline import DeadlineScheduler
from ttsvc.worker.deadline_policy import Live
from ttsvc.worker.streams import Send

DEFAULT_JSON = RESULTS / "step_bench.json"
DEFAULT_IDS = "10,25,50,100,150,200,300,400"
DEFAULT_WIDTHS = "16,32,64,128,256,512"
"""Window frames before contexts; each engine runs on these plus its own left and right
context, as the synthesizer runs it."""
DEFAULT_CHUNK_FRAMES = "16,64,128,512"
PARAMS = SynthesisParams(noise_scale=0.0, noise_w=0.0)


def ms(seconds: float) -> float:
    """Seconds to milliseconds, rounded to what perf_counter resolves meaningfully here."""
    return round(seconds * 1000.0, 4)


def median(values: Sequence[float]) -> float:
    """Median of a non-empty sample."""
    return float(np.median(np.asarray(values, dtype=np.float64)))


def timed(fn: Callable[[], object]) -> float:
    """Wall seconds of one call."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def rotating(
    cases: dict[str, Callable[[], object]], reps: int, warmup: int = 1
) -> dict[str, list[float]]:
    """``reps`` timed calls of each case, the order rotated every round; GC off while timing."""
    names = list(cases)
    for _ in range(warmup):  # first runs size ORT's arenas for each shape; not measured
        for name in names:
            cases[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    gc.collect()
    gc.disable()
    try:
        for rep in range(reps):
            shift = rep % len(names)
            for name in names[shift:] + names[:shift]:
                times[name].append(timed(cases[name]))
    finally:
        gc.enable()
    return times


# --------------------------------------------------------------------------- engines


def id_pool(synth: Synthesizer, corpus: list[str], want: int) -> list[int]:
    """Real phoneme ids, sentence after sentence, until there are ``want`` of them.

    Slices of this run through the acoustic engine as one "sentence" of that many ids: the
    engine's cost depends on the count, and real ids keep the predicted durations (hence the
    frames it produces) realistic.
    """
    pool: list[int] = []
    for line in corpus:
        for sentence in synth.sentences(line):
            pool.extend(sentence.ids)
        if len(pool) >= want:
            return pool
    raise SystemExit(f"the corpus makes only {len(pool)} ids, want {want}")


def bench_acoustic(
    synth: Synthesizer, pool: list[int], counts: list[int], reps: int
) -> list[dict[str, Any]]:
    """Acoustic engine run time for each id count, with the frames (audio) each run makes."""
    frames = {n: int(synth.latents(pool[:n], PARAMS).shape[2]) for n in counts}
    cases = {str(n): (lambda n=n: synth.latents(pool[:n], PARAMS)) for n in counts}
    times = rotating(cases, reps)
    frame_s = synth.hop / synth.sample_rate
    rows = []
    for n in counts:
        cost = median(times[str(n)])
        audio_s = frames[n] * frame_s
        rows.append(
            {
                "ids": n,
                "frames": frames[n],
                "audio_s": round(audio_s, 4),
                "median_ms": ms(cost),
                "ms_per_audio_s": round(1000.0 * cost / audio_s, 2),
                "runs_ms": [ms(t) for t in times[str(n)]],
            }
        )
    return rows


def frame_input(synth: Synthesizer, pool: list[int], width: int) -> tuple[Any, Any]:
    """Real latents and decoder frames at least ``width`` frames long (tiled if need be)."""
    latents = synth.latents(pool, PARAMS)
    frames = synth.frames(latents)
    reps = -(-width // latents.shape[2])
    return np.tile(latents, (1, 1, reps)), np.tile(frames, (1, 1, reps))


def bench_frames(
    synth: Synthesizer, pool: list[int], widths: list[int], reps: int
) -> list[dict[str, Any]]:
    """Flow and vocoder run time per window width, each engine with its own contexts."""
    vctx = synth.vocoder_context.left + synth.vocoder_context.right
    fctx = 0 if synth.flow_context is None else synth.flow_context.left + synth.flow_context.right
    latents, frames = frame_input(synth, pool, max(widths) + max(vctx, fctx))
    flow, vocoder = synth.engines.flow, synth.engines.vocoder
    cases: dict[str, Callable[[], object]] = {}
    for w in widths:
        cases[f"vocoder:{w}"] = lambda w=w: vocoder.waveform(frames[:, :, : w + vctx])
        if flow is not None:
            cases[f"flow:{w}"] = lambda w=w: flow.frames(latents[:, :, : w + fctx])
    times = rotating(cases, reps)
    frame_s = synth.hop / synth.sample_rate
    rows = []
    for w in widths:
        row: dict[str, Any] = {"frames": w, "audio_ms": round(1000.0 * w * frame_s, 1)}
        for stage, ctx in (("flow", fctx), ("vocoder", vctx)):
            key = f"{stage}:{w}"
            if key not in times:
                continue
            cost = median(times[key])
            row[stage] = {
                "width": w + ctx,
                "median_ms": ms(cost),
                "us_per_frame": round(1e6 * cost / w, 1),
                "runs_ms": [ms(t) for t in times[key]],
            }
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- per-step overheads


def bench_pickle(synth: Synthesizer, chunk_frames: list[int], reps: int) -> list[dict[str, Any]]:
    """Cost of one ``AudioChunkMsg`` through pickle, and through a real pipe, per chunk size.

    The pipe figure is ``Connection.send`` in this thread and ``recv`` in a reader thread
    (what the worker's sender and the gateway's reader do, minus the process switch), per
    message, over a batch of messages.
    """
    rng = np.random.default_rng(7)
    rows = []
    for frames in chunk_frames:
        samples = frames * synth.hop
        pcm = to_pcm16(rng.uniform(-0.5, 0.5, samples).astype(np.float32))
        msg = AudioChunkMsg("r-" + "0" * 30, pcm.astype("<i2").tobytes(), 12345, "v1", 0.01)
        blob = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)

        def pipe_batch(count: int = 50, msg: AudioChunkMsg = msg) -> None:
            ours, theirs = Pipe()

            def reader() -> None:
                for _ in range(count):
                    theirs.recv()

            thread = threading.Thread(target=reader)
            thread.start()
            for _ in range(count):
                ours.send(msg)
            thread.join()
            ours.close()
            theirs.close()

        times = rotating(
            {
                "dumps": lambda msg=msg: pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL),
                "loads": lambda blob=blob: pickle.loads(blob),
                "tobytes": lambda pcm=pcm: pcm.astype("<i2").tobytes(),
            },
            reps * 20,
        )
        pipe = rotating({"pipe": pipe_batch}, max(3, reps // 2))["pipe"]
        rows.append(
            {
                "frames": frames,
                "bytes": len(msg.pcm),
                "dumps_us": round(1e6 * median(times["dumps"]), 2),
                "loads_us": round(1e6 * median(times["loads"]), 2),
                "pcm_tobytes_us": round(1e6 * median(times["tobytes"]), 2),
                "pipe_send_recv_us": round(1e6 * median(pipe) / 50, 2),
            }
        )
    return rows


ENGINE_ENTRIES = {
    "acoustic": ("latents", "run"),
    "flow": ("frames", "step", "frames_batch"),
    "vocoder": ("waveform", "step", "waveform_batch"),
}
"""Every way into an engine a step may take (``Synthesizer.run_call``: ``run`` for a sentence,
``step`` on stateful engines, ``frames``/``waveform`` otherwise; the batch forms on GPU plans)."""


class EngineTimer:
    """Wraps one engine set's run methods (on the instances, nothing in ``src`` changes) to sum
    the seconds spent inside engine runs and the front end, so a scheduler step's remainder is
    the Python around them. Only the outermost call counts, so an entry that calls another
    (``latents`` through ``run``, say) is not counted twice. One thread at a time."""

    def __init__(self, synth: Synthesizer) -> None:
        self.inside = 0.0
        self.calls = 0
        """Outermost calls timed: every scheduler step makes at least one."""
        self._depth = 0
        engines = synth.engines
        targets: list[tuple[object, str]] = [
            (synth.frontend, "sentences"),
            (synth.frontend, "run_sentences"),
        ]
        for role, names in ENGINE_ENTRIES.items():
            engine = getattr(engines, role)
            targets += [(engine, name) for name in names if engine is not None]
        for obj, name in targets:
            if callable(getattr(obj, name, None)):
                setattr(obj, name, self._wrap(getattr(obj, name)))

    def _wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            self._depth += 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.inside += time.perf_counter() - start
                    self.calls += 1

        return run


STEP_TIMEOUT_S = 120.0
"""How long the scheduler run waits for any one stream to end before it gives up."""


def bench_scheduler(
    engines_path: Path, texts: list[str], streams: int, rounds: int
) -> dict[str, Any]:
    """Python seconds per scheduler step outside engine runs and the front end.

    Drives the worker's ``DeadlineScheduler`` on one compute thread (so the engine timer's sum
    is that one step's) with ``streams`` streams arriving together, ``rounds`` times. Each step
    is timed whole (``pick`` plus ``step``: the policy's choice, the engine call, the budget
    the window is sized by, the chunk messages) and minus the time inside the wrapped engines.
    Sending is a list append here: pickling and the pipe are measured on their own above.
    """
    synth = Synthesizer(load_engine_set(engines_path, 1))
    synth.calibrate()
    timer = EngineTimer(synth)
    # per_thread as the worker tests give it: a capacity that admits every stream of a round
    scheduler = DeadlineScheduler(synth, threads=1, per_thread=10.0)
    measuring = False
    picked = 0.0
    overheads: list[float] = []
    steps: list[float] = []
    # the methods are wrapped on the instance: its compute thread calls them through ``self``
    pick, step = scheduler.pick, scheduler.step

    def timed_pick() -> Live | None:
        nonlocal picked
        start = time.perf_counter()
        chosen = pick()
        if chosen is not None:  # a pick that finds nothing is idle time, not a step's
            picked = time.perf_counter() - start
        return chosen

    def timed_step(stream: Live, send: Send, riders: Sequence[Live] = ()) -> None:
        timer.inside = 0.0
        start = time.perf_counter()
        try:
            step(stream, send, riders)
        finally:
            whole = time.perf_counter() - start + picked
            if measuring:
                steps.append(whole)
                overheads.append(whole - timer.inside)

    scheduler.pick = timed_pick  # type: ignore[method-assign]
    scheduler.step = timed_step  # type: ignore[method-assign]
    sent: list[FromWorker] = []
    ended = threading.Semaphore(0)
    failed: list[str] = []

    def send(msg: FromWorker) -> None:
        sent.append(msg)
        if isinstance(msg, StreamDone | StreamError):
            if isinstance(msg, StreamError):
                failed.append(f"{msg.uid}: {msg.type}: {msg.message}")
            ended.release()

    scheduler.start(send)
    try:
        for round_ in range(rounds + 1):  # round 0 warms up; not measured
            measuring = round_ > 0
            gc.collect()
            gc.disable()
            try:
                with scheduler.lock:  # the round's streams arrive together, as before a step
                    for index in range(streams):
                        text = texts[(round_ * streams + index) % len(texts)]
                        scheduler.add(SynthesisJob(f"s{round_}-{index}", text, 1.0, 0.0, 0.0,
                                                   0.2))  # fmt: skip
                for _ in range(streams):
                    if not ended.acquire(timeout=STEP_TIMEOUT_S):
                        raise RuntimeError(f"a stream did not end within {STEP_TIMEOUT_S:g} s")
            finally:
                gc.enable()
            sent.clear()
    finally:
        scheduler.close()
    if failed:
        raise RuntimeError(f"streams failed in the scheduler run: {failed[:3]}")
    return {
        "scheduler": "DeadlineScheduler",
        "threads": 1,
        "streams": streams,
        "rounds": rounds,
        "steps": len(steps),
        "median_step_ms": ms(median(steps)),
        "median_overhead_us": round(1e6 * median(overheads), 1),
        "p90_overhead_us": round(1e6 * pct(overheads, 90), 1),
        "overhead_share_pct": round(100.0 * sum(overheads) / sum(steps), 2),
        "engine_calls": timer.calls,
    }


# --------------------------------------------------------------------------- thread scaling


def bench_threads(
    synth: Synthesizer, pool: list[int], widths: list[int], runs: int, rounds: int
) -> list[dict[str, Any]]:
    """Engine runs per second from two threads sharing one session vs one thread.

    Vocoder windows of each width, and one acoustic run of a 150-id sentence. Each round times
    ``runs`` calls on one thread, then ``runs`` calls on each of two threads started together (a
    barrier), in alternating order; the ratio is per round (side by side, so drift between
    rounds cancels), reported as the median over rounds.

    On a shared machine the wall-clock ratio also measures whoever else holds the cores, so
    each phase records the process's CPU seconds too: CPU per run with two threads against one
    says whether the threads slow each other down (memory bandwidth, a lock) regardless of other
    tenants, and CPU seconds per wall second says how many cores the two threads really got.
    """
    vctx = synth.vocoder_context.left + synth.vocoder_context.right
    _, frames = frame_input(synth, pool, max(widths) + vctx)
    vocoder = synth.engines.vocoder
    cases: list[tuple[str, int, Callable[[], object]]] = []
    for w in widths:
        window = np.ascontiguousarray(frames[:, :, : w + vctx])
        cases.append((f"vocoder {w} frames", w + vctx, lambda x=window: vocoder.waveform(x)))
    ids = pool[:150]
    cases.append(("acoustic 150 ids", 150, lambda: synth.latents(ids, PARAMS)))

    def one(call: Callable[[], object]) -> tuple[float, float, float]:
        cpu, start = time.process_time(), time.perf_counter()
        for _ in range(runs):
            call()
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        return runs / wall, cpu / runs, cpu / wall

    def two(call: Callable[[], object]) -> tuple[float, float, float]:
        barrier = threading.Barrier(3)

        def work() -> None:
            barrier.wait()
            for _ in range(runs):
                call()

        threads = [threading.Thread(target=work) for _ in range(2)]
        for thread in threads:
            thread.start()
        barrier.wait()
        cpu, start = time.process_time(), time.perf_counter()
        for thread in threads:
            thread.join()
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        return 2 * runs / wall, cpu / (2 * runs), cpu / wall

    rows = []
    for label, width, call in cases:
        one(call)  # warm the shapes (and each thread's first use of the session)
        two(call)
        ones: list[tuple[float, float, float]] = []
        twos: list[tuple[float, float, float]] = []
        loads: list[float] = []
        for round_ in range(rounds):
            loads.append(os.getloadavg()[0])
            if round_ % 2 == 0:
                ones.append(one(call))
                twos.append(two(call))
            else:
                twos.append(two(call))
                ones.append(one(call))
        ratios = [b[0] / a[0] for a, b in zip(ones, twos, strict=True)]
        cpu_ratios = [b[1] / a[1] for a, b in zip(ones, twos, strict=True)]
        rows.append(
            {
                "case": label,
                "width": width,
                "one_thread_runs_per_s": round(median([o[0] for o in ones]), 2),
                "two_threads_runs_per_s": round(median([t[0] for t in twos]), 2),
                "ratio_median": round(median(ratios), 3),
                "ratios": [round(r, 3) for r in ratios],
                "cpu_ms_per_run_one": round(1000 * median([o[1] for o in ones]), 2),
                "cpu_ms_per_run_two": round(1000 * median([t[1] for t in twos]), 2),
                "cpu_per_run_ratio_median": round(median(cpu_ratios), 3),
                "cores_used_two": round(median([t[2] for t in twos]), 2),
                "cores_used_two_all": [round(t[2], 2) for t in twos],
                "loadavg_1m": [round(x, 2) for x in loads],
            }
        )
    return rows


# --------------------------------------------------------------------------- output


def render(doc: dict[str, Any]) -> str:
    """Markdown tables of the medians."""
    out = [
        f"# Step costs ({doc['date']}, {doc['machine']['cpu_count']} CPUs, load average "
        f"{doc['loadavg_start'][0]:.2f} at start / {doc['loadavg_end'][0]:.2f} at end; one ORT "
        "thread per session; medians)",
        "",
        "## Acoustic engine vs phoneme ids",
        "",
        "| ids | frames | audio s | median ms | ms per audio s |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in doc["acoustic"]:
        out.append(f"| {r['ids']} | {r['frames']} | {r['audio_s']:.2f} | {r['median_ms']:.1f} | "
                   f"{r['ms_per_audio_s']:.1f} |")  # fmt: skip
    out += [
        "",
        "## Flow and vocoder vs window (frames before contexts; width = with contexts)",
        "",
        "| frames | audio ms | flow width | flow ms | flow µs/frame | vocoder width | "
        "vocoder ms | vocoder µs/frame |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["frames"]:
        f, v = r.get("flow", {}), r["vocoder"]
        out.append(
            f"| {r['frames']} | {r['audio_ms']:.0f} | {f.get('width', '–')} | "
            f"{fmt(f.get('median_ms'), 2)} | {fmt(f.get('us_per_frame'), 0)} | {v['width']} | "
            f"{v['median_ms']:.2f} | {v['us_per_frame']:.0f} |"
        )
    out += [
        "",
        "## Chunk message (AudioChunkMsg) per step",
        "",
        "| frames | bytes | pickle.dumps µs | pickle.loads µs | pcm tobytes µs "
        "| pipe send+recv µs |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["pickle"]:
        out.append(f"| {r['frames']} | {r['bytes']} | {r['dumps_us']:.1f} | {r['loads_us']:.1f} | "
                   f"{r['pcm_tobytes_us']:.1f} | {r['pipe_send_recv_us']:.1f} |")  # fmt: skip
    sched = doc["scheduler"]
    out += ["", "## Scheduler Python per step (outside engine runs and the front end)", ""]
    out.append(
        f"{sched['scheduler']}, {sched['threads']} compute thread: {sched['streams']} streams x "
        f"{sched['rounds']} rounds, {sched['steps']} steps: median step "
        f"{sched['median_step_ms']:.1f} ms, overhead median {sched['median_overhead_us']:.0f} "
        f"µs (p90 {sched['p90_overhead_us']:.0f} µs), {sched['overhead_share_pct']:.1f} % of "
        "step time"
    )
    out += [
        "",
        "## Two compute threads, one process, one shared session per engine",
        "",
        "Wall ratio: runs/s with two threads over one (depends on who else holds the cores). "
        "CPU ratio: CPU seconds per run with two threads over one (1.0: the threads do not slow "
        "each other down). Cores: CPU seconds per wall second the two threads got.",
        "",
        "| case | input width | 1 thread runs/s | 2 threads runs/s | wall ratio | "
        "CPU ms/run 1 → 2 | CPU ratio | cores (2 threads) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["threads"]:
        out.append(f"| {r['case']} | {r['width']} | {r['one_thread_runs_per_s']:.1f} | "
                   f"{r['two_threads_runs_per_s']:.1f} | {r['ratio_median']:.2f} | "
                   f"{r['cpu_ms_per_run_one']:.1f} → {r['cpu_ms_per_run_two']:.1f} | "
                   f"{r['cpu_per_run_ratio_median']:.2f} | "
                   f"{r['cores_used_two']:.2f} |")  # fmt: skip
    return "\n".join(out)


def int_list(spec: str) -> list[int]:
    """``"1,2,3"`` to ``[1, 2, 3]``."""
    return [int(x) for x in spec.split(",") if x.strip()]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Flags; the defaults produced the committed results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--engines-dir", type=Path, default=DEFAULT_ENGINES,
                        help="engine repository; the default voice is compiled here if missing "
                        "(default: %(default)s)")  # fmt: skip
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--ids", default=DEFAULT_IDS, help="phoneme id counts (%(default)s)")
    parser.add_argument("--widths", default=DEFAULT_WIDTHS,
                        help="window frames before contexts (%(default)s)")  # fmt: skip
    parser.add_argument("--chunk-frames", default=DEFAULT_CHUNK_FRAMES,
                        help="chunk sizes for the message costs (%(default)s)")  # fmt: skip
    parser.add_argument("--reps", type=int, default=9, help="repetitions per case (%(default)s)")
    parser.add_argument("--sched-streams", type=int, default=4,
                        help="streams at once in the scheduler run (%(default)s)")  # fmt: skip
    parser.add_argument("--sched-rounds", type=int, default=5,
                        help="measured rounds of the scheduler run (%(default)s)")  # fmt: skip
    parser.add_argument("--thread-widths", default="64,128,512",
                        help="vocoder frames for the thread scaling (%(default)s)")  # fmt: skip
    parser.add_argument("--thread-runs", type=int, default=20,
                        help="windows per thread per round (%(default)s)")  # fmt: skip
    parser.add_argument("--thread-rounds", type=int, default=6,
                        help="rounds of one vs two threads (%(default)s)")  # fmt: skip
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON,
                        help="where to write results (%(default)s)")  # fmt: skip
    args = parser.parse_args(argv)
    for name in ("reps", "sched_streams", "sched_rounds", "thread_runs", "thread_rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Load the default voice, measure each part, print the tables, write the JSON."""
    args = parse_args(argv)
    configure_logging("warning")  # a line per stream would bury the tables
    loadavg_start = os.getloadavg()

    def log(message: str) -> None:
        print(message, file=sys.stderr)

    version = ensure_default_voice(args.engines_dir, log)
    corpus = load_corpus(args.corpus)
    counts, widths = int_list(args.ids), int_list(args.widths)
    synth = Synthesizer(load_engine_set(version.path, 1))
    pool = id_pool(synth, corpus, max(counts))
    started = time.perf_counter()
    log("acoustic engine vs ids")
    acoustic = bench_acoustic(synth, pool, counts, args.reps)
    log("flow and vocoder vs window width")
    frames = bench_frames(synth, pool, widths, args.reps)
    log("chunk message costs")
    pickled = bench_pickle(synth, int_list(args.chunk_frames), args.reps)
    log("scheduler Python per step")
    sched = bench_scheduler(version.path, corpus, args.sched_streams, args.sched_rounds)
    log("two threads vs one")
    threads = bench_threads(
        synth, pool, int_list(args.thread_widths), args.thread_runs, args.thread_rounds
    )
    doc: dict[str, Any] = {
        "date": utc_timestamp(),
        "machine": machine_info({"onnxruntime": ort.__version__, "numpy": np.__version__}),
        "note": "shared machine: other processes ran during the measurement; medians",
        "loadavg_start": [round(x, 2) for x in loadavg_start],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "duration_s": round(time.perf_counter() - started, 1),
        "settings": {
            "engines": relative(version.path),
            "ort_threads": 1,
            "reps": args.reps,
            "contexts": {k: v.model_dump() for k, v in synth.engines.manifest.contexts.items()},
            "hop_length": synth.hop,
            "sample_rate": synth.sample_rate,
            "thread_runs": args.thread_runs,
            "thread_rounds": args.thread_rounds,
            "corpus": relative(args.corpus),
        },
        "acoustic": acoustic,
        "frames": frames,
        "pickle": pickled,
        "scheduler": sched,
        "threads": threads,
    }
    table = render(doc)
    print(table)
    write_json(args.json, doc, clean_nan=False, ensure_ascii=False)
    write_atomic(args.json.with_suffix(".md"), table + "\n")
    log(f"wrote {relative(args.json)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
