"""The deadline scheduler's cost model: what a step costs, and how much audio a process computes.

Why a module of its own: the scheduler (``worker.deadline``) orders steps, bounds them and admits
streams, and each of those decisions rests on estimates — what a stream's pending engine call
costs, what its next chunk costs, how much slower steps run now than when measured alone, how
many audio seconds per second the process computes (``Capacity``), and whether a layout of the
other streams' steps on the other threads would start one of them late (``first_late``). Those
estimates are plain arithmetic over the per-frame and per-phoneme costs the synthesizer measured
at start (``measure`` streams the canary for the first figures), with no lock, thread or clock
of their own, so they are tested on their own and the scheduler reads as policy.
"""

from __future__ import annotations

import heapq
import time

from ttsvc.synthesis import CANARY_TEXT, SynthesisParams, Synthesizer
from ttsvc.worker.streams import ActiveStream

LAYOUT_STEP_S = 0.03
"""The least audio ``first_late`` counts a laid-out step as buying its stream, so a layout of
streams whose steps buy almost nothing still ends."""
CAPACITY_MEMORY = 200
"""Steps over which the measured capacity averages (exponentially): a few seconds of work."""
PRIOR_WEIGHT_S = 1.0
"""Compute seconds the canary's figure counts as at start (``Capacity``): enough to steady the
first second of a burst, whose front ends and acoustic runs yield no audio yet."""
PRIOR_FADE_S = 5.0
"""Compute seconds of real steps (summed over the threads: 2.5 s of a busy 2-thread worker)
over which the canary's weight falls linearly to nothing, so no start-up figure outlives them."""
PRIOR_PER_THREAD = (1.0, 100.0)
"""The canary's audio seconds per second on one thread count within these bounds: below real
time a thread still serves its one stream (admission always fills the threads), and far above
the fastest figure measured here (10.8 a thread, a medium voice) is a timing gone wrong."""
SLOWDOWN_RANGE = (0.5, 4.0)
"""One step's wall time over its estimate counts within these bounds (a step stopped by the
kernel for a second must not make every estimate absurd)."""


class Capacity:
    """Audio seconds per second one process computes with all its threads, from step costs.

    Measured from wall time per step rather than CPU time, so a core shared with the gateway or
    another tenant shows as less capacity, which is what admission needs to know.

    The canary's figure (``per_thread``, from ``measure``) is a prior only: it is taken in a
    fraction of a second at start, when the machine may be loading other workers (too low: the
    worker is sent fewer streams than it can serve) or idle (too high: it is sent more). It is
    clamped to ``PRIOR_PER_THREAD`` and counts as ``PRIOR_WEIGHT_S`` compute seconds at its
    rate, a weight that falls linearly to nothing over the first ``PRIOR_FADE_S`` seconds of
    real steps; from then on the figure is the real steps' alone (averaged exponentially over
    ``CAPACITY_MEMORY`` steps). A worker the prior makes full still gets those steps: admission
    and routing always give it one stream per compute thread (``DeadlinePolicy._room``,
    ``HeatScoreBalancer``).
    """

    def __init__(self, threads: int, per_thread: float) -> None:
        self.threads = threads
        low, high = PRIOR_PER_THREAD
        self.prior = min(max(per_thread, low), high) if per_thread > 0 else 0.0
        """The canary's audio seconds per second on one thread, clamped (0: unknown)."""
        self._seen = 0.0
        self._audio = 0.0
        self._compute = 0.0

    def record(self, audio_s: float, compute_s: float) -> None:
        """One step's audio (0 for an acoustic or flow step) and its wall time."""
        keep = 1.0 - 1.0 / CAPACITY_MEMORY
        self._audio = keep * self._audio + audio_s
        self._compute = keep * self._compute + compute_s
        self._seen += compute_s

    @property
    def prior_weight(self) -> float:
        """Compute seconds the canary's figure still counts as (0 once ``PRIOR_FADE_S`` seconds
        of real steps have run, or with no figure)."""
        if self.prior <= 0:
            return 0.0
        return PRIOR_WEIGHT_S * max(0.0, 1.0 - self._seen / PRIOR_FADE_S)

    @property
    def value(self) -> float:
        """Audio seconds per second with every thread busy (0: unknown)."""
        weight = self.prior_weight
        if weight + self._compute <= 0:
            return 0.0
        return self.threads * (weight * self.prior + self._audio) / (weight + self._compute)


def chunk_cost(stream: ActiveStream, first_chunk_s: float) -> float:
    """Seconds from the stream's pending call to its next chunk, from the costs measured at
    start, alone on a core (``first_chunk_s``: a stream not started)."""
    synth, call = stream.synth, stream.pending
    first = synth.schedule.first
    vctx, fctx = synth.vocoder_context, synth.flow_context
    window = synth.vocoder_call_s + (first + vctx.left + vctx.right) * synth.vocoder_cost_s
    flow = (0.0 if fctx is None else synth.flow_call_s
            + (first + vctx.right + fctx.right) * synth.flow_cost_s)  # fmt: skip
    if call is None:  # not started: front end, acoustic run, then the first window
        return first_chunk_s
    if call.stage == "acoustic":
        return int(call.inputs.shape[1]) * synth.acoustic_cost_s + flow + window
    if call.plain:  # a whole sentence: from its flow call, the flow and the vocoder
        if call.stage == "flow":
            return synth.whole_cost(int(call.inputs.shape[2]))
        return call_cost(stream, first_chunk_s)
    if call.stage == "flow":  # the window it feeds, as the synthesizer sized it
        frames = call.window or first
        return (call_cost(stream, first_chunk_s) + synth.vocoder_call_s
                + (frames + vctx.left + vctx.right) * synth.vocoder_cost_s)  # fmt: skip
    return call_cost(stream, first_chunk_s)


def call_cost(stream: ActiveStream, first_chunk_s: float) -> float:
    """The pending call's cost from the costs measured at start, alone on a core
    (``first_chunk_s``: a stream not started)."""
    synth, call = stream.synth, stream.pending
    if call is None:
        return first_chunk_s
    if call.stage == "acoustic":
        return int(call.inputs.shape[1]) * synth.acoustic_cost_s
    if call.plain:  # a whole sentence on the plain graphs
        per_frame, fixed = synth.whole_costs.get(call.stage, (0.0, 0.0))
        return fixed + int(call.inputs.shape[2]) * per_frame
    if call.stage == "flow":
        return synth.flow_call_s + int(call.inputs.shape[2]) * synth.flow_cost_s
    return synth.vocoder_call_s + int(call.inputs.shape[2]) * synth.vocoder_cost_s


def slowdown_after(slowdown: float, elapsed: float, estimate: float) -> float:
    """``slowdown`` updated with one engine call that took ``elapsed`` against its ``estimate``
    (exponential over ``CAPACITY_MEMORY``, the ratio bounded by ``SLOWDOWN_RANGE``)."""
    keep = 1.0 - 1.0 / CAPACITY_MEMORY
    ratio = min(max(elapsed / estimate, SLOWDOWN_RANGE[0]), SLOWDOWN_RANGE[1])
    return keep * slowdown + (1.0 - keep) * ratio


def first_late(tasks: list[tuple[float, float, float]], free: list[float],
               horizon: float) -> float | None:  # fmt: skip
    """When the first of ``tasks`` would start late on threads that free at ``free``, or None.

    A task is ``(start_by, cost, rate)``: a stream whose next step must start by ``start_by``
    and costs ``cost`` compute seconds; its chunk then buys the stream ``cost * rate`` seconds
    of audio, so its following step is due that much later (and costs the same). Tasks go in
    order of ``start_by`` to the thread that frees first, until ``horizon``; with no thread at
    all, the first ``start_by``.
    """
    queue = list(tasks)
    heapq.heapify(queue)
    threads = sorted(free)
    while queue:
        start_by, cost, rate = heapq.heappop(queue)
        if start_by >= horizon:
            return None
        if not threads:
            return start_by
        begin = heapq.heappop(threads)
        if begin > start_by:
            return start_by
        heapq.heappush(threads, begin + cost)
        if rate > 0:  # each step buys at least a floor's worth, so the layout ends
            heapq.heappush(queue, (start_by + max(cost * rate, LAYOUT_STEP_S), cost, rate))
    return None


def measure(synth: Synthesizer) -> tuple[float, float, float]:
    """Stream the canary as a stream would: audio seconds one thread computes per second (the
    prior of ``Capacity``, until ``PRIOR_FADE_S`` of real steps replace it), seconds to its
    first chunk, and audio seconds per character of text (the start of ``audio_per_char``)."""
    params = SynthesisParams(noise_scale=0.0, noise_w=0.0)
    started = time.perf_counter()
    first = 0.0
    samples = 0
    for chunk in synth.stream(CANARY_TEXT, params):
        first = first or time.perf_counter() - started
        samples += len(chunk.samples)
    audio = samples / synth.sample_rate
    rate = audio / max(time.perf_counter() - started, 1e-9)
    return rate, first, audio / len(CANARY_TEXT)
