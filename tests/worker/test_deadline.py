"""The deadline scheduler's policy on a fake clock (order, step bound, admission, no starvation)
and its threads on the real engines (exact audio, cancellation, failures stay per stream)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from ttsvc.backends.base import EngineSet
from ttsvc.protocol import AudioChunkMsg, FromWorker, StreamDone, StreamError, SynthesisJob
from ttsvc.synthesis import FrameCall, SynthesisParams, Synthesizer
from ttsvc.windows import DELIVERY_S
from ttsvc.worker.costs import Capacity
from ttsvc.worker.deadline import DeadlineScheduler
from ttsvc.worker.deadline_policy import GUARD_S, STEP_FLOOR_S, Live

TEXT = "Your order has shipped. It will arrive on Thursday between nine and noon."


class FakeClock:
    """Monotonic seconds that move only when a test says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def job(uid: str, text: str = TEXT, key: str | None = None) -> SynthesisJob:
    return SynthesisJob(uid, text, 1.0, 0.0, 0.0, 0.2, key=key)


@pytest.fixture(scope="module")
def synth(engine_set: EngineSet) -> Synthesizer:
    """A synthesizer calibrated as a worker's is, its per-frame costs then fixed."""
    s = Synthesizer(engine_set)
    s.calibrate()
    # the policy's bounds compare these costs with fixed slacks: fix them at what one core here
    # measures alone, so the tests do not depend on how busy the machine is when they start
    s.acoustic_cost_s, s.flow_cost_s, s.vocoder_cost_s = 0.00024, 0.00015, 0.00063
    s.frame_cost_s = s.flow_cost_s + s.vocoder_cost_s
    s.whole_costs = {"flow": (0.0001, 0.001), "vocoder": (0.00045, 0.0)}  # the plain graphs
    return s


FLOOR_S = 0.03
"""The policy tests' step floor, below the default: they check the bounds the layout sets."""


def scheduler(synth: Synthesizer, clock: FakeClock, threads: int = 2,
              per_thread: float = 10.0, load_limit: float = 0.9) -> DeadlineScheduler:  # fmt: skip
    return DeadlineScheduler(synth, threads, load_limit, per_thread, clock=clock,
                             first_chunk_s=0.05, step_floor_s=FLOOR_S)  # fmt: skip


def playing(sched: DeadlineScheduler, uid: str, buffered_s: float, started_ago: float = 1.0,
            pending: FrameCall | None = None) -> Live:  # fmt: skip
    """Make ``uid`` a stream that has sent audio which runs out ``buffered_s`` from now."""
    stream = sched.streams[uid]
    rate = stream.synth.sample_rate
    stream.first_sent_at = sched.clock() - started_ago
    stream.samples_sent = round((started_ago + buffered_s) * rate)
    stream.pending = pending or FrameCall("vocoder", np.zeros((1, 192, 40), np.float32))
    return stream


def test_fresh_streams_go_before_playing_streams_with_audio_to_spare(synth: Synthesizer) -> None:
    clock = FakeClock()
    sched = scheduler(synth, clock)
    sched.add(job("playing"))
    playing(sched, "playing", buffered_s=1.0)
    clock.now += 0.01
    sched.add(job("fresh"))
    assert sched.pick() is sched.streams["fresh"]


def test_a_playing_stream_about_to_run_dry_goes_before_fresh_ones(synth: Synthesizer) -> None:
    clock = FakeClock()
    sched = scheduler(synth, clock, threads=1)
    sched.add(job("fresh"))
    sched.add(job("playing"))
    stream = playing(sched, "playing", buffered_s=GUARD_S / 2)
    assert sched.pick() is stream


@pytest.mark.parametrize(("guard_s", "first"), [(GUARD_S, "playing"), (GUARD_S / 10, "fresh")])
def test_the_guard_decides_when_a_playing_stream_goes_first(
    synth: Synthesizer, guard_s: float, first: str
) -> None:
    clock = FakeClock()
    sched = DeadlineScheduler(synth, 1, 0.9, 10.0, clock=clock, first_chunk_s=0.05,
                              guard_s=guard_s)  # fmt: skip
    sched.add(job("fresh"))
    sched.add(job("playing"))
    stream = playing(sched, "playing", buffered_s=GUARD_S)
    # its next step must start within the default guard, but not within a tenth of it
    assert clock.now + GUARD_S / 10 < sched.latest_start(stream) <= clock.now + GUARD_S
    assert sched.pick() is sched.streams[first]


def test_playing_streams_go_least_laxity_first(synth: Synthesizer) -> None:
    clock = FakeClock()
    sched = scheduler(synth, clock)
    for uid in ("a", "b", "c"):
        sched.add(job(uid))
    playing(sched, "a", buffered_s=2.0)
    playing(sched, "b", buffered_s=1.0)
    # c has more audio buffered than b, but a flow chunk (and then a window) to run first
    flow = FrameCall("flow", np.zeros((1, 192, 2000), np.float32))
    playing(sched, "c", buffered_s=1.05, pending=flow)
    assert sched.cost_to_chunk(sched.streams["c"]) > 0.05 + sched.cost_to_chunk(sched.streams["b"])
    assert sched.pick() is sched.streams["c"]
    sched.streams["c"].running = True  # taken by a thread: the next one goes elsewhere
    assert sched.pick() is sched.streams["b"]


def test_a_pending_flow_call_is_priced_with_the_window_it_feeds(synth: Synthesizer) -> None:
    # issue 37: the window after a flow call was priced as a first window (16 frames) where
    # the synthesizer's real ones are 50-123: such streams were picked 20-70 ms late
    clock = FakeClock()
    sched = scheduler(synth, clock)
    sched.add(job("a"))
    a = playing(sched, "a", buffered_s=1.0)
    inputs = np.zeros((1, 192, 140), np.float32)
    a.pending = FrameCall("flow", inputs, window=synth.schedule.first)
    small = sched.cost_to_chunk(a)
    a.pending = FrameCall("flow", inputs, window=120)
    wide = sched.cost_to_chunk(a)
    extra = (120 - synth.schedule.first) * synth.vocoder_cost_s * sched.slowdown
    assert wide == pytest.approx(small + extra)
    a.pending = FrameCall("flow", inputs)  # not said: a first window, as before
    assert sched.cost_to_chunk(a) == pytest.approx(small)


def test_a_whole_sentence_is_priced_on_the_plain_graphs(synth: Synthesizer) -> None:
    clock = FakeClock()
    sched = scheduler(synth, clock)
    sched.add(job("a"))
    a = playing(sched, "a", buffered_s=1.0)
    latents = np.zeros((1, 192, 200), np.float32)
    a.pending = FrameCall("flow", latents, window=200, plain=True)
    assert sched.step_cost(a) == pytest.approx(0.001 + 200 * 0.0001)
    # its chunk comes after the plain vocoder call on the same frames
    assert sched.cost_to_chunk(a) == pytest.approx(synth.whole_cost(200))
    assert synth.whole_cost(200) == pytest.approx(0.001 + 200 * (0.0001 + 0.00045))
    a.pending = FrameCall("vocoder", latents, plain=True)
    assert sched.step_cost(a) == sched.cost_to_chunk(a) == pytest.approx(200 * 0.00045)
    a.pending = FrameCall("vocoder", latents)  # the same frames through the stateful vocoder
    assert sched.step_cost(a) == pytest.approx(synth.vocoder_call_s + 200 * 0.00063)


def test_a_first_sentence_runs_whole_only_while_others_wait_for_admission(
    synth: Synthesizer,
) -> None:
    clock = FakeClock()
    sched = scheduler(synth, clock, threads=1, per_thread=2.0, load_limit=1.0)
    sched.add(job("a"))
    a = sched.streams["a"]
    alone = sched.step_cost(a)
    assert alone == pytest.approx(sched.first_chunk_s)
    assert not sched.whole(a, 0.1)  # nothing waits: it streams, its first audio soon
    sched.add(job("b"))
    sched.add(job("c"))
    assert sched.waiting() == 1
    assert sched.whole(a, 0.1)
    # its first step is priced as its whole first sentence: the text's estimated audio
    frames = round(len(TEXT) * sched.audio_per_char * synth.sample_rate / synth.hop)
    assert sched.step_cost(a) == pytest.approx(alone + synth.whole_cost(frames))
    sched.whole_sentences = False  # --no-whole-sentences
    assert not sched.whole(a, 0.1)
    assert sched.step_cost(a) == pytest.approx(alone)


def test_a_later_sentence_runs_whole_while_its_buffer_and_the_budget_allow(
    synth: Synthesizer,
) -> None:
    clock = FakeClock()
    sched = scheduler(synth, clock, threads=2, per_thread=10.0)
    sched.add(job("a"))
    a = playing(sched, "a", buffered_s=2.0)
    assert sched.budget(a) is None  # a free thread for everyone else
    assert sched.whole(a, 0.15)
    playing(sched, "a", buffered_s=0.3)  # the sentence before ends in 300 ms
    assert not sched.whole(a, 0.15)  # whole, it would come too close to running dry
    assert sched.whole(a, 0.05)
    playing(sched, "a", buffered_s=2.0)
    sched.add(job("b"))
    b = playing(sched, "b", buffered_s=5.0)
    b.running, b.busy_until = True, clock.now + 0.5  # the other thread is away
    assert sched.budget(a) == pytest.approx(sched.first_audio_s - sched.first_chunk_s)
    assert not sched.whole(a, 0.15)  # longer than the newcomer's first chunk can wait
    assert sched.whole(a, 0.04)
    sched.whole_sentences = False
    assert not sched.whole(a, 0.04)


def test_fresh_streams_finish_first_chunks_in_arrival_order(synth: Synthesizer) -> None:
    """A burst shares one first-audio target: each finishes its first chunk before the next
    starts, instead of every acoustic run going before any first window."""
    clock = FakeClock()
    sched = scheduler(synth, clock)
    sched.add(job("first"))
    clock.now += 0.001
    sched.add(job("second"))
    first = sched.streams["first"]
    first.steps = iter(())  # type: ignore[assignment]  # started: its acoustic run is done
    first.pending = FrameCall("flow", np.zeros((1, 192, 60), np.float32))
    assert sched.pick() is first


def test_a_free_thread_for_every_other_stream_leaves_steps_unbounded(
    synth: Synthesizer,
) -> None:
    clock = FakeClock()
    sched = scheduler(synth, clock, threads=2, per_thread=10.0)
    sched.add(job("a"))
    sched.add(job("b"))
    playing(sched, "b", buffered_s=0.04)  # however pressed b is, the other thread is free
    assert sched._room()  # and a newcomer would find it free too
    assert sched.budget(sched.streams["a"]) is None


def test_with_every_other_thread_busy_a_newcomer_bounds_steps(synth: Synthesizer) -> None:
    clock = FakeClock()
    sched = scheduler(synth, clock, threads=2, per_thread=10.0)
    sched.add(job("a"))
    sched.add(job("b"))
    b = playing(sched, "b", buffered_s=5.0)
    b.running, b.busy_until = True, clock.now + 0.5  # the other thread is away for 500 ms
    assert sched.budget(sched.streams["a"]) == pytest.approx(
        sched.first_audio_s - sched.first_chunk_s)  # a newcomer's first chunk starts in time
    sched.capacity = Capacity(threads=2, per_thread=0.1)  # full: no newcomer to wait for
    assert not sched._room()
    assert sched.budget(sched.streams["a"]) is None


def test_steps_are_bounded_by_the_others_latest_start_with_a_floor(synth: Synthesizer) -> None:
    clock = FakeClock()
    sched = scheduler(synth, clock, threads=1, per_thread=2.0, load_limit=1.0)
    for uid in ("a", "b", "c"):
        sched.add(job(uid))
    assert sched.waiting() == 1  # 2 audio-s/s of capacity: two streams, the third waits
    playing(sched, "a", buffered_s=3.0)
    b = playing(sched, "b", buffered_s=0.4)
    assert sched.budget(sched.streams["a"]) == pytest.approx(
        0.4 - DELIVERY_S - sched.cost_to_chunk(b))  # then this thread must turn to b
    playing(sched, "b", buffered_s=0.01)
    assert sched.budget(sched.streams["a"]) == FLOOR_S
    sched.step_floor_s = STEP_FLOOR_S  # the default floor: longer than that layout's bound
    assert sched.budget(sched.streams["a"]) == STEP_FLOOR_S
    playing(sched, "b", buffered_s=-0.5)  # already dry: past helping, no reason to shrink
    assert sched.budget(sched.streams["a"]) is None


def test_steps_shrink_when_the_other_threads_cannot_keep_up(synth: Synthesizer) -> None:
    """Two threads, eight pressed streams: the other thread alone cannot start every one of
    them in time, so the step is bounded; with fewer streams it can, and the step is not."""
    clock = FakeClock()
    sched = scheduler(synth, clock, threads=2, per_thread=100.0)
    sched.add(job("a"))
    playing(sched, "a", buffered_s=5.0)
    for k in range(8):
        sched.add(job(f"s{k}"))
        playing(sched, f"s{k}", buffered_s=0.15)
    sched.load_limit = 0.0  # no room: no newcomer to wait for
    assert not sched._room()
    bound = sched.budget(sched.streams["a"])
    assert bound is not None and FLOOR_S <= bound < 0.15
    for k in range(7):
        with sched.lock:
            sched._remove(sched.streams[f"s{k}"])
    assert sched.budget(sched.streams["a"]) is None


def test_with_room_for_a_newcomer_steps_leave_time_for_its_first_audio(
    synth: Synthesizer,
) -> None:
    clock = FakeClock()
    sched = scheduler(synth, clock, threads=1, per_thread=100.0)
    sched.add(job("a"))
    sched.add(job("b"))
    playing(sched, "a", buffered_s=5.0)
    playing(sched, "b", buffered_s=5.0)
    assert sched.budget(sched.streams["a"]) == pytest.approx(
        sched.first_audio_s - sched.first_chunk_s)


def test_estimates_follow_how_slow_steps_run_now(synth: Synthesizer) -> None:
    clock = FakeClock()
    sched = scheduler(synth, clock)
    sched.add(job("a"))
    a = playing(sched, "a", buffered_s=1.0)
    alone = sched.step_cost(a)
    a.estimate = alone
    with sched.lock:
        for _ in range(2000):  # every step takes twice its estimate (a shared core)
            sched.record(a, audio_s=0.1, elapsed=2 * alone)
    assert sched.slowdown == pytest.approx(2.0, rel=0.01)
    assert sched.step_cost(a) == pytest.approx(2 * alone, rel=0.01)
    with sched.lock:
        sched.record(a, audio_s=0.1, elapsed=3600.0)  # a step stopped by the kernel
    assert sched.slowdown < 2.1


def test_admission_by_real_time_capacity(synth: Synthesizer) -> None:
    clock = FakeClock()
    sched = scheduler(synth, clock, threads=2, per_thread=2.0, load_limit=0.9)
    assert sched.capacity.value == pytest.approx(4.0)
    for uid in "abcde":
        sched.add(job(uid))
    # 0.9 x 4 = 3.6 audio-s/s: three streams of one audio-s/s each, the rest wait
    assert [s.admitted for s in sched.streams.values()] == [True, True, True, False, False]
    assert sched.demand() == 3.0 and sched.waiting() == 2
    picked = sched.pick()
    assert picked is not None and picked.job.uid in "abc"
    with sched.lock:
        sched._remove(sched.streams["b"])
    assert sched.streams["d"].admitted and not sched.streams["e"].admitted


def test_a_stream_ahead_of_its_listener_needs_less_and_lets_another_in(
    synth: Synthesizer,
) -> None:
    clock = FakeClock()
    sched = scheduler(synth, clock, threads=2, per_thread=2.0, load_limit=0.9)
    for uid in "abcd":
        sched.add(job(uid))
    assert sched.waiting() == 1  # three of one audio-s/s each fit 3.6
    left = len(TEXT) * sched.audio_per_char - 1.0  # what "a" has left after 1 s of audio
    a = playing(sched, "a", buffered_s=0.0)  # at its deadline: still needs one
    assert sched.demand() == pytest.approx(3.0, abs=0.01)
    a.samples_sent = round((1.0 + left) * synth.sample_rate)  # all computed but the last bit
    playing(sched, "b", buffered_s=left)  # as much buffered as it has left: half
    b = sched.streams["b"]
    b.samples_sent = round((1.0 + left) * synth.sample_rate)
    with sched.lock:
        sched.admit()
    assert sched.demand() < 3.0 and sched.streams["d"].admitted


def test_threads_are_always_filled_whatever_the_capacity(synth: Synthesizer) -> None:
    clock = FakeClock()
    sched = scheduler(synth, clock, threads=2, per_thread=0.1)
    sched.add(job("a"))
    sched.add(job("b"))
    sched.add(job("c"))
    assert sched.demand() == 2.0 and sched.waiting() == 1


def test_admission_serves_the_key_with_fewest_admitted_streams(synth: Synthesizer) -> None:
    clock = FakeClock()
    sched = scheduler(synth, clock, threads=1, per_thread=2.0, load_limit=1.0)
    sched.add(job("flood-1", key="flood"))
    for n in (2, 3):
        clock.now += 0.01
        sched.add(job(f"flood-{n}", key="flood"))
    clock.now += 0.01
    sched.add(job("other-1", key="other"))
    with sched.lock:
        sched._remove(sched.streams["flood-1"])
    assert sched.streams["other-1"].admitted  # arrived last, but its key holds nothing


def simulate(synth: Synthesizer, burst: int, load_limit: float = 1.0) -> tuple[set[str], int, int]:
    """Simulated steps on the fake clock, one thread, each step 20 ms: a fresh stream takes
    three steps to its first chunk (acoustic run, flow, first window: 186 ms of audio), then
    each step adds 150 ms; ``burst`` streams arrive every 60 steps (3: 75 % busy). Returns the
    streams that got their first chunk, how many chunks a playing stream got after its audio
    ran out, and the most streams admission held back at once."""
    clock = FakeClock()
    sched = scheduler(synth, clock, threads=1, per_thread=5.0, load_limit=load_limit)
    rate = synth.sample_rate
    step_s = 0.02
    prelude: dict[str, int] = {}
    started: set[str] = set()
    dry = held = 0
    for n in range(1500):
        if n % 60 == 0 and n < 1200:
            for k in range(burst):
                sched.add(job(f"s{n}-{k}"))
                prelude[f"s{n}-{k}"] = 3
        held = max(held, sched.waiting())
        stream = sched.pick()
        if stream is None:
            clock.now += step_s
            continue
        if stream.first_sent_at is not None and clock.now + step_s > sched.due(stream):
            dry += 1
        clock.now += step_s
        uid = stream.job.uid
        stream.steps = iter(())  # type: ignore[assignment]
        stream.pending = FrameCall("vocoder", np.zeros((1, 192, 30), np.float32))
        prelude[uid] -= 1
        if prelude[uid] > 0:
            continue
        if stream.first_sent_at is None:
            stream.first_sent_at = clock.now
            stream.samples_sent = round(0.186 * rate)
            started.add(uid)
        else:
            stream.samples_sent += round(0.15 * rate)
        if stream.samples_sent > 2 * rate:
            with sched.lock:  # two seconds of audio: done, the next waiting one enters
                sched._remove(stream)
    return started, dry, held


def test_no_stream_starves_or_runs_dry_under_bursts_within_capacity(synth: Synthesizer) -> None:
    """Bursts of three streams every 60 steps (75 % busy): every stream gets its first chunk,
    and no playing stream is served after its audio ran out."""
    started, dry, _ = simulate(synth, burst=3)
    assert started == {f"s{n}-{k}" for n in range(0, 1200, 60) for k in range(3)}
    assert dry == 0


def test_at_three_times_capacity_admitted_streams_keep_their_deadlines(
    synth: Synthesizer,
) -> None:
    """Bursts of nine (225 % busy, three times the load above) at the default 0.75 load limit:
    admission holds the excess back, and not one chunk of a stream it let in comes late."""
    started, dry, held = simulate(synth, burst=9, load_limit=0.75)
    assert held > 9  # the overload was real: streams waited for room
    assert started  # and some were served
    assert dry == 0


# -- threads on the real engines ---------------------------------------------------------------


def run_all(sched: DeadlineScheduler, jobs: list[SynthesisJob],
            queued: bool = False) -> dict[str, list[FromWorker]]:  # fmt: skip
    """Start the threads, add ``jobs`` (``queued``: before the threads start, so each stream
    sees all the others), and collect every message until each stream ended."""
    out: dict[str, list[FromWorker]] = {j.uid: [] for j in jobs}
    ended = threading.Semaphore(0)
    lock = threading.Lock()

    def send(msg: FromWorker) -> None:
        assert isinstance(msg, AudioChunkMsg | StreamDone | StreamError)
        with lock:
            out[msg.uid].append(msg)
        if isinstance(msg, StreamDone | StreamError):
            ended.release()

    for j in jobs if queued else []:
        sched.add(j)
    sched.start(send)
    try:
        for j in [] if queued else jobs:
            sched.add(j)
        for _ in jobs:
            assert ended.acquire(timeout=120), "a stream never ended"
    finally:
        sched.close()
    return out


def test_threaded_streams_are_exact_and_end_once(synth: Synthesizer) -> None:
    texts = [TEXT, "Reply STOP to stop.", "The quick brown fox jumps over the lazy dog. " * 3]
    jobs = [job(f"s{i}", text) for i, text in enumerate(texts * 2)]
    sched = DeadlineScheduler(synth, threads=2, per_thread=10.0)
    out = run_all(sched, jobs)
    params = SynthesisParams(noise_scale=0.0, noise_w=0.0)
    for j in jobs:
        msgs = out[j.uid]
        assert isinstance(msgs[-1], StreamDone)
        assert all(isinstance(m, AudioChunkMsg) for m in msgs[:-1])
        pcm = b"".join(m.pcm for m in msgs if isinstance(m, AudioChunkMsg))
        got = np.frombuffer(pcm, dtype="<i2").astype(np.int32)
        whole = synth.synthesize(j.text, params).astype(np.int32)
        assert len(got) == len(whole)
        assert np.max(np.abs(got - whole)) <= 33  # windows match one-shot to float rounding
    assert not sched.streams
    assert sched.capacity.value > 0


@pytest.mark.parametrize("whole", [True, False])
def test_a_stream_started_while_others_wait_says_its_sentences_whole(
    synth: Synthesizer, whole: bool
) -> None:
    """One thread whose capacity admits one stream: the first starts while the others wait
    for admission, so its sentences run whole (one chunk each, the streamed audio); with
    ``--no-whole-sentences`` it streams in windows. Every stream is exact either way."""
    jobs = [job(f"s{i}", TEXT) for i in range(3)]
    sched = DeadlineScheduler(synth, threads=1, per_thread=1.0, whole_sentences=whole)
    out = run_all(sched, jobs, queued=True)
    chunks = [m for m in out["s0"] if isinstance(m, AudioChunkMsg)]
    assert (len(chunks) == 2) is whole  # TEXT is two sentences
    params = SynthesisParams(noise_scale=0.0, noise_w=0.0)
    reference = synth.synthesize(TEXT, params).astype(np.int32)
    for j in jobs:
        assert isinstance(out[j.uid][-1], StreamDone)
        pcm = b"".join(m.pcm for m in out[j.uid] if isinstance(m, AudioChunkMsg))
        got = np.frombuffer(pcm, dtype="<i2").astype(np.int32)
        assert len(got) == len(reference) and np.max(np.abs(got - reference)) <= 33


def test_a_stream_alone_on_its_worker_starts_with_the_smaller_first_window(
    synth: Synthesizer,
) -> None:
    """Nothing else plays: a 4-frame first chunk (``WindowSchedule.alone_first``); with a peer
    already queued, the usual 16 frames, which cover the peer's sentence start."""

    def first_chunks(count: int) -> list[int]:
        jobs = [job(f"s{i}", TEXT) for i in range(count)]
        out = run_all(DeadlineScheduler(synth, threads=2, per_thread=10.0), jobs,
                      queued=True)  # fmt: skip
        return [len(next(m for m in out[j.uid] if isinstance(m, AudioChunkMsg)).pcm) // 2
                for j in jobs]  # fmt: skip

    assert synth.schedule.alone().first == 4 < synth.schedule.first == 16
    assert first_chunks(1) == [4 * synth.hop]
    assert first_chunks(2) == [16 * synth.hop] * 2


def test_a_failing_stream_fails_alone(synth: Synthesizer) -> None:
    bad = job("bad", "…")  # nothing to speak: the front end raises in the stream's first step
    sched = DeadlineScheduler(synth, threads=2, per_thread=10.0)
    out = run_all(sched, [bad, job("good")])
    assert isinstance(out["bad"][-1], StreamError) and out["bad"][-1].status == 422
    assert isinstance(out["good"][-1], StreamDone)


def test_cancel_during_a_step_ends_the_stream_once(synth: Synthesizer) -> None:
    clock = FakeClock()
    sched = scheduler(synth, clock)
    sched.add(job("a"))
    stream = sched.streams["a"]
    stream.running = True  # a thread is inside its step
    assert sched.cancel("a") is None  # the thread will send the final message
    sent: list[FromWorker] = []
    sched.step(stream, sent.append)
    assert [type(m) for m in sent] == [StreamDone]
    assert "a" not in sched.streams


def test_a_fresh_streams_first_chunk_is_one_step(
    synth: Synthesizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its front end, acoustic run and first window run back to back in one step, as
    ``busy_until`` and ``budget`` count it: between them it would queue behind playing streams
    again. The steps after it are single engine calls."""
    calls: list[str] = []
    run_call = synth.run_call

    def counted(call: FrameCall) -> object:
        calls.append(call.stage)
        return run_call(call)

    monkeypatch.setattr(synth, "run_call", counted)
    sched = scheduler(synth, FakeClock())
    sched.add(job("a"))
    stream = sched.streams["a"]
    sent: list[FromWorker] = []
    stream.running = True
    sched.step(stream, sent.append)
    assert [type(m) for m in sent] == [AudioChunkMsg]
    assert calls == ["acoustic", "flow", "vocoder"]
    assert stream.pending is not None and not stream.running
    stream.running = True
    sched.step(stream, sent.append)
    assert len(calls) == 4  # one engine call
