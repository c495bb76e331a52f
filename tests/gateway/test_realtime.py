"""Real-time callers on a real server, well under its capacity, never hear their stream stall.

The service's promise is speech that keeps playing once it starts. This runs a real
``ttsvc serve`` (one worker process with two compute threads over one deadline queue) and a few
callers that each play every answer in real time before asking again, as a voice bot's callers
do, and checks each stream against a player that starts shortly after the first audio byte:
audio must always have arrived before the player needs it. No wall-clock figure is asserted
(time to first audio, throughput): only that playback never ran dry.

``TTSVC_TEST_REALTIME_ARGS`` replaces the ``ttsvc serve`` flags (to run the same check against
another scheduler, e.g. ``--workers 2`` on a service without ``--compute-threads``), and
``TTSVC_TEST_REALTIME_CALLERS`` the number of callers (to look for the load where it breaks).
"""

from __future__ import annotations

import json
import os
import shlex
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.gateway.serving import Server
from ttsvc.repository.layout import EngineVersion

SERVE_ARGS = "--workers 1 --compute-threads 2"
"""One process, two compute threads: the deadline scheduler's domain spans both cores."""
CALLERS = 4
"""Concurrent callers: about 4 audio-seconds per second of demand, well under what two cores
compute (several times real time each), so any stall is the scheduler's doing."""
REQUESTS_PER_CALLER = 3
PLAYBACK_BUFFER_S = 0.15
"""The player starts this long after the first audio byte, as a client's jitter buffer does
(real players buffer this much or more before they start). The test machine is shared: a
scheduling hiccup there (another process holding one of the two cores, a GC pause in this
client) must not count as a stall, while a stream held up behind other streams' long steps
(a sentence's acoustic run, a wide window) falls behind by more than this and still does."""
WAV_HEADER_BYTES = 44

TEXTS = (
    "Your table for four is confirmed for Friday at seven.",
    "Please hold while I transfer you to the billing team.",
    "The next train to Boston leaves from platform nine.",
    "I found three flights that match your dates. Shall I book the earliest one?",
    "Your package was delivered this morning at the front desk.",
    "Say or enter your account number, followed by the pound key.",
    "The pharmacy closes at nine tonight. It opens again at eight tomorrow.",
    "Thank you for calling, and have a wonderful afternoon.",
    "Your appointment with Doctor Patel is on the twelfth of March.",
    "I did not catch that. Could you repeat the last four digits?",
    "The current balance on your card is two hundred dollars.",
    "Press one for English, or stay on the line for more options.",
)
"""Short voice-bot prompts of one or two sentences: a second sentence's acoustic run lands in
the middle of a stream, where it must not hold up any stream's next window."""


@dataclass
class Heard:
    """One answer as its caller received it: (arrival, audio seconds) per read."""

    text: str
    status: int = 0
    reads: list[tuple[float, float]] = field(default_factory=list)
    refusal: dict[str, str] = field(default_factory=dict)
    """A refusal's body and its ``Retry-After`` (``retry_after``)."""

    @property
    def audio_s(self) -> float:
        return sum(seconds for _, seconds in self.reads)


def stalls(reads: Sequence[tuple[float, float]], buffer_s: float) -> list[float]:
    """Playback positions (seconds of audio) at which a player would have run dry.

    The player starts ``buffer_s`` after the first audio arrives and plays on in real time; the
    read that brings audio from position ``p`` on must arrive by ``start + p``. The player's
    clock never pauses: a stream judged late once stays judged against its first schedule, so
    every read after a stall that still misses that schedule is listed too.
    """
    if not reads:
        return []
    start = reads[0][0] + buffer_s
    position, late = 0.0, []
    for arrival, seconds in reads:
        if arrival > start + position:
            late.append(round(position, 3))
        position += seconds
    return late


def test_stalls_finds_a_read_that_arrives_after_its_playback_position() -> None:
    on_time = [(0.0, 0.2), (0.25, 0.5), (0.7, 1.0)]
    assert stalls(on_time, buffer_s=0.1) == []
    assert stalls([(0.0, 0.2), (0.35, 0.5)], buffer_s=0.1) == [0.2]  # due at 0.3
    assert stalls([(0.0, 0.2), (0.35, 0.5)], buffer_s=0.2) == []


@pytest.fixture(scope="module")
def server(default_version: EngineVersion, engines_root: Path) -> Iterator[Server]:
    args = shlex.split(os.environ.get("TTSVC_TEST_REALTIME_ARGS", SERVE_ARGS))
    workers = int(args[args.index("--workers") + 1]) if "--workers" in args else 1
    srv = Server(engines_root, *args)
    srv.wait_ready(workers)
    yield srv
    srv.stop()


def ask(client: httpx.Client, text: str) -> Heard:
    """One streamed answer, each read timed as it arrives (``iter_raw``: nothing buffered)."""
    heard = Heard(text)
    body = {"text": text, "noise_scale": 0.0, "noise_w": 0.0}
    with client.stream("POST", "/synthesize", json=body) as resp:
        heard.status = resp.status_code
        if resp.status_code != 200:
            resp.read()
            heard.refusal = {**resp.json(), "retry_after": resp.headers.get("Retry-After", "")}
            return heard
        header, rate = b"", 0
        for raw in resp.iter_raw():
            now = time.monotonic()
            audio = raw
            if len(header) < WAV_HEADER_BYTES:
                take = WAV_HEADER_BYTES - len(header)
                header, audio = header + raw[:take], raw[take:]
                if len(header) == WAV_HEADER_BYTES:
                    rate = int.from_bytes(header[24:28], "little")
            if audio and rate:
                heard.reads.append((now, len(audio) / 2 / rate))
    return heard


def call_together(url: str, callers: int, calls: int,
                  one: Callable[[httpx.Client, int, int], float]) -> None:  # fmt: skip
    """``callers`` threads, each with its own client, whose first calls start at once (a
    barrier: the hardest start) and who make ``calls`` calls each: ``one(client, caller, n)``
    makes call ``n`` and returns how long its caller then waits (listening to the answer, or a
    refusal's ``Retry-After``: the workload, not synchronization). The first failure hangs
    every caller up and is raised here."""
    failed: list[BaseException] = []
    gate = threading.Barrier(callers)
    hung_up = threading.Event()
    """Set when a caller fails, so the others stop listening instead of finishing their calls."""

    def caller(index: int) -> None:
        try:
            with httpx.Client(base_url=url, timeout=60) as client:
                gate.wait()
                for n in range(calls):
                    if hung_up.wait(max(0.0, one(client, index, n))):
                        return
        except BaseException as exc:  # raised by the test thread below
            failed.append(exc)
            hung_up.set()
            gate.abort()

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failed:
        raise failed[0]


@pytest.mark.realtime
def test_realtime_callers_under_capacity_never_stall(server: Server) -> None:
    callers = int(os.environ.get("TTSVC_TEST_REALTIME_CALLERS", CALLERS))
    answers: list[list[Heard]] = [[] for _ in range(callers)]

    def one(client: httpx.Client, index: int, n: int) -> float:
        heard = ask(client, TEXTS[(index * REQUESTS_PER_CALLER + n) % len(TEXTS)])
        answers[index].append(heard)
        if heard.status != 200 or not heard.reads:
            raise AssertionError(f"{heard.text!r}: {heard.status}, no audio")
        # the caller listens before asking again: demand stays one stream per caller
        return heard.reads[0][0] + PLAYBACK_BUFFER_S + heard.audio_s - time.monotonic()

    try:
        call_together(server.url, callers, REQUESTS_PER_CALLER, one)
    except BaseException as exc:
        raise AssertionError(f"{exc!r}\n{server.log_tail()}") from exc
    stalled = {
        f"caller {index} call {n}: {heard.text}": late
        for index, calls in enumerate(answers)
        for n, heard in enumerate(calls)
        if (late := stalls(heard.reads, PLAYBACK_BUFFER_S))
    }
    streams = sum(len(calls) for calls in answers)
    assert streams == callers * REQUESTS_PER_CALLER
    assert not stalled, (
        f"{len(stalled)} of {streams} streams ran dry, at these playback positions (s): {stalled}"
    )


OVERLOAD_CALLERS = 48
"""Callers that all ask at once: several times what two cores carry in real time (the 2-core
figure of issue 37 is about 24), so the service must refuse some to keep the rest playing."""
OVERLOAD_TRIES = 2
"""Requests each caller makes; a refused one waits its ``Retry-After`` before the next."""
OVERLOAD_BUFFER_S = 0.4
"""The overload test's player buffer. Its 48 callers are Python threads on the same two cores
as the server, so a read reaches its caller when the caller gets the GIL back, not when the
bytes arrive: reads coalesce (a stream's second read carries the whole rest of its sentence,
1.0-1.3 s of audio, that the worker sent as several chunks) and arrive up to 0.21 s after
``PLAYBACK_BUFFER_S``'s schedule (worst of 25 runs on a 2-core AMD EPYC; CI went red once at
0.19 s, 1 stream of 23). What a worse admission costs is larger: past what the cores carry,
issue 37 measured streams whole seconds late."""


@pytest.fixture(scope="module")
def refusing(default_version: EngineVersion, engines_root: Path) -> Iterator[Server]:
    """A server that refuses what it has no real-time room for (the service's default), with
    stream slots for every caller so that only headroom refuses."""
    srv = Server(engines_root, *SERVE_ARGS.split(), "--max-streams-per-worker", "80",
                 env={"TTSVC_OVERLOAD": "refuse"})  # fmt: skip
    srv.wait_ready(1)
    yield srv
    srv.stop()


def ask_or_refused(client: httpx.Client, text: str) -> tuple[Heard, float]:
    """``ask``, and for a refusal (which must be 429 ``no_headroom``) the ``Retry-After`` it
    carried (0 for an answer)."""
    heard = ask(client, text)
    if heard.status == 200:
        return heard, 0.0
    assert (heard.status, heard.refusal.get("type")) == (429, "no_headroom"), heard.refusal
    return heard, float(heard.refusal["retry_after"])


@pytest.mark.realtime
def test_under_overload_the_excess_is_refused_and_admitted_streams_never_stall(
    refusing: Server,
) -> None:
    answers: list[Heard] = []
    waits: list[float] = []
    lock = threading.Lock()

    def one(client: httpx.Client, index: int, n: int) -> float:
        text = TEXTS[(index * OVERLOAD_TRIES + n) % len(TEXTS)]
        heard, retry_after = ask_or_refused(client, text)
        with lock:
            answers.append(heard)
            waits.append(retry_after)
        if heard.status == 200 and not heard.reads:
            raise AssertionError(f"{heard.text!r}: 200 without audio")
        if retry_after:
            return retry_after  # as the refusal asked
        return heard.reads[0][0] + OVERLOAD_BUFFER_S + heard.audio_s - time.monotonic()

    try:
        call_together(refusing.url, OVERLOAD_CALLERS, OVERLOAD_TRIES, one)
    except BaseException as exc:
        raise AssertionError(f"{exc!r}\n{refusing.log_tail()}") from exc
    admitted = [heard for heard in answers if heard.status == 200]
    refused = [wait for heard, wait in zip(answers, waits, strict=True) if heard.status == 429]
    assert len(answers) == OVERLOAD_CALLERS * OVERLOAD_TRIES
    assert admitted and refused, f"{len(admitted)} admitted, {len(refused)} refused"
    assert all(wait >= 1 for wait in refused)  # a Retry-After in whole seconds
    stalled = {heard.text: late for heard in admitted
               if (late := stalls(heard.reads, OVERLOAD_BUFFER_S))}  # fmt: skip
    assert not stalled, (
        f"{len(stalled)} of {len(admitted)} admitted streams ran dry ({len(refused)} refused), "
        f"at these playback positions (s): {stalled}"
    )
    records = [json.loads(line) for line in refusing.log_lines() if line.startswith("{")]
    no_room = [r for r in records if r.get("event") == "request"
               and r.get("status") == "no_headroom"]  # fmt: skip
    assert len(no_room) == len(refused)  # each refusal recorded once, none reached a worker
    assert all(r["worker"] is None and r["code"] == 429 for r in no_room)
