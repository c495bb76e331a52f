"""The exchange in process: dispatch, first audio, the rest, and every way a request ends.

A request's one completion record, its cancel to the worker and its released slot were proven
only through a real server and worker (tests/gateway/test_server.py, test_connections.py ...),
where a failure at a chosen moment (a worker's error after the first audio, the client leaving
while queued, the drain's grace ending mid-stream) is hard to arrange and slow. Here the test
speaks for the worker on the scripted pool, and the queue deadline and the stall limit run on a
loop clock the test moves.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import numpy as np
import pytest
import structlog

from tests.gateway.core.conftest import QUEUE_TIMEOUT_S, Core, FakeClock, chunk, order
from ttsvc.audio.wav import streaming_header, wav_bytes
from ttsvc.errors import ClientClosedRequest, NothingToSay, QueueTimeout, ShutDown
from ttsvc.gateway.core.caller import Caller
from ttsvc.gateway.core.exchange import (
    SILENCE_S,
    SynthesisExchange,
    WorkerReportedError,
    start_exchange,
)
from ttsvc.gateway.core.order import SpeechOrder
from ttsvc.gateway.core.quotas import Quota
from ttsvc.protocol import AudioChunkMsg, CancelStream, StreamDone, StreamError, SynthesisJob

RATE = 22050
"""The scripted voice's own rate (no catalog: ``native_rate``'s default)."""
PCM1 = np.arange(0, 400, dtype="<i2").tobytes()
PCM2 = np.arange(400, 700, dtype="<i2").tobytes()


@pytest.fixture
def logs() -> Iterator[list[structlog.typing.EventDict]]:
    with structlog.testing.capture_logs() as captured:
        yield captured


def request_lines(logs: list[structlog.typing.EventDict]) -> list[structlog.typing.EventDict]:
    """The completion lines written so far."""
    return [entry for entry in logs if entry["event"] == "request"]


async def begin(
    core: Core, speech: SpeechOrder, caller: Caller, *, queued_s: float = 0.0
) -> tuple[SynthesisJob, SynthesisExchange, AudioChunkMsg]:
    """Start an exchange and answer its job with its first audio (``PCM1``)."""
    started = asyncio.ensure_future(start_exchange(core.state, speech, caller))
    job = await core.dispatched()
    core.say(chunk(job.uid, PCM1, queued_s=queued_s))
    exchange, first = await started
    return job, exchange, first


async def gather(chunks: AsyncIterator[AudioChunkMsg]) -> list[AudioChunkMsg]:
    return [msg async for msg in chunks]


def frozen_loop_clock(core: Core, monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """The pool loop's clock, moved by hand: its timers (the queue deadline, the stall limit)
    fire when the test says their time has come, and never on their own."""
    clock = FakeClock()
    monkeypatch.setattr(core.loop, "time", clock)
    return clock


# --- dispatch and the first audio ---------------------------------------------------------


def test_the_job_goes_to_the_picked_worker_with_the_order_s_settings(core: Core) -> None:
    core.ready()
    key = core.keyed(Quota())
    speech = SpeechOrder(text="Hello there.", voice="voice", format=order().format, stream=True,
                         api="synthesize", speed=1.25, sentence_silence=0.1,
                         timestamps=True)  # fmt: skip
    job, _, _ = core.run(begin(core, speech, Caller(key=key)))
    assert (job.text, job.speed, job.sentence_silence, job.voice) == ("Hello there.", 1.25, 0.1,
                                                                       "voice")  # fmt: skip
    assert (job.sample_rate, job.max_audio_s, job.key, job.timestamps) == (RATE, 60.0, "alice",
                                                                           True)  # fmt: skip
    assert core.handle.streams == {job.uid}
    assert core.sent() == []  # that one job, nothing else


def test_a_client_s_request_id_is_never_the_job_s(core: Core) -> None:
    core.ready()
    job, _, _ = core.run(begin(core, order(), Caller(client_request_id="mine")))
    assert job.uid != "mine" and len(job.uid) == 32


def test_the_first_audio_is_returned_and_accounted(core: Core) -> None:
    core.ready()
    caller = Caller()
    job, exchange, first = core.run(begin(core, order(), caller, queued_s=0.25))
    assert first == chunk(job.uid, PCM1, queued_s=0.25)
    assert exchange.audio_s == len(PCM1) / 2 / RATE
    assert exchange.engine_version == "1" and exchange.first_audio_s is not None
    assert core.value("ttsvc_ttfa_seconds_count") == 1
    assert core.value("ttsvc_queue_wait_seconds_sum") == 0.25
    assert core.value("ttsvc_format_requests_total", {"format": "pcm", "api": "synthesize"}) == 1
    assert core.state.inflight == 1 and not core.state.idle.is_set()
    assert core.records() == 0 and not caller.recorded  # not over yet


# --- ends -------------------------------------------------------------------------------------


def test_the_rest_streams_and_stream_done_records_ok_once(
    core: Core, logs: list[structlog.typing.EventDict]
) -> None:
    core.ready()
    caller = Caller(labels={"format": "pcm"})
    job, exchange, _ = core.run(begin(core, order(), caller))
    second = chunk(job.uid, PCM2, 400)
    core.say(second)
    core.say(StreamDone(job.uid, 700, compute_s=0.5))
    assert core.run(gather(exchange.rest())) == [second]
    assert exchange.failure is None and exchange.compute_s == 0.5
    assert (core.records(), core.records("200", "ok")) == (1, 1)
    (line,) = request_lines(logs)
    assert (line["uid"], line["code"], line["status"], line["worker"]) == (job.uid, 200, "ok", 0)
    assert (line["format"], line["key"], line["text_len"]) == ("pcm", None, len("Hello there."))
    assert "error_type" not in line
    assert caller.recorded and caller.request_id == job.uid and not caller.cut
    assert core.state.inflight == 0 and core.state.idle.is_set()
    assert job.uid not in core.state.pool.mailboxes  # type: ignore[union-attr]
    assert core.value("ttsvc_characters_total") == len("Hello there.")


def test_a_key_s_stream_is_given_back_when_its_exchange_ends(core: Core) -> None:
    core.ready()
    key = core.keyed(Quota(streams=1))
    job, exchange, _ = core.run(begin(core, order(), Caller(key=key)))
    assert core.state.limiter.streams("alice") == 1
    core.say(StreamDone(job.uid, 400, compute_s=0.1))
    core.run(gather(exchange.rest()))
    assert core.state.limiter.streams("alice") == 0


def test_a_worker_error_before_the_first_audio_is_answered_with_its_status(core: Core) -> None:
    core.ready()
    caller = Caller()

    async def scenario() -> tuple[SynthesisJob, WorkerReportedError]:
        started = asyncio.ensure_future(start_exchange(core.state, order(), caller))
        job = await core.dispatched()
        core.say(StreamError(job.uid, 422, "unspeakable_text", "the phonemizer crashed", "text"))
        with pytest.raises(WorkerReportedError) as failed:
            await started
        return job, failed.value

    job, error = core.run(scenario())
    assert (error.status, error.type, error.field) == (422, "unspeakable_text", "text")
    assert error.message == "the phonemizer crashed"
    assert (core.records(), core.records("422", "unspeakable_text")) == (1, 1)
    assert caller.recorded and caller.request_id == job.uid
    assert core.sent() == []  # the worker ended the stream itself: nothing to cancel
    assert core.state.inflight == 0 and core.state.idle.is_set()


def test_nothing_the_worker_finds_to_say_is_a_short_silence_recorded_200_empty_text(
    core: Core, logs: list[structlog.typing.EventDict]
) -> None:
    """The worker found nothing to say before any audio (a sentence of only symbols it alone
    could judge): the exchange answers ``SILENCE_S`` of zeros at the order's rate, marked
    silent, and ends there, recorded once as ``empty_text`` with a 200."""
    core.ready()
    caller = Caller()

    async def scenario() -> tuple[SynthesisJob, SynthesisExchange, AudioChunkMsg]:
        started = asyncio.ensure_future(start_exchange(core.state, order(sample_rate=16000),
                                                       caller))  # fmt: skip
        job = await core.dispatched()
        core.say(StreamError(job.uid, 422, "empty_text", "nothing to speak", "text"))
        exchange, first = await started
        assert await gather(exchange.rest()) == []
        return job, exchange, first

    job, exchange, first = core.run(scenario())
    assert exchange.silent and first.pcm == bytes(2 * round(SILENCE_S * 16000))
    assert exchange.audio_s == pytest.approx(SILENCE_S)
    (line,) = request_lines(logs)
    assert (line["uid"], line["code"], line["status"], line["worker"]) == (job.uid, 200,
                                                                           "empty_text", 0)
    assert (core.records(), core.records("200", "empty_text")) == (1, 1)
    assert core.sent() == []  # the worker ended the stream itself: nothing to cancel
    assert core.state.inflight == 0 and job.uid not in core.state.pool.mailboxes  # type: ignore[union-attr]


def test_a_silence_costs_its_key_no_audio_quota(core: Core) -> None:
    """A key with a quota of exactly one silence's length: were the silence charged, the key
    would be at 0 and refused (no clock moves here to refill it)."""
    core.ready()
    key = core.keyed(Quota(audio_s_per_minute=SILENCE_S))

    async def scenario() -> None:
        started = asyncio.ensure_future(start_exchange(core.state, order(), Caller(key=key)))
        job = await core.dispatched()
        core.say(StreamError(job.uid, 422, "empty_text", "nothing to speak", "text"))
        exchange, _ = await started
        assert await gather(exchange.rest()) == []
        assert exchange.silent and exchange.ticket is not None and exchange.ticket.settled

    core.run(scenario())
    core.state.limiter.admit(key.name, key.quota, 1)  # not RateLimited: the quota is whole


def test_nothing_the_worker_finds_to_say_asked_as_an_error_is_its_422(core: Core) -> None:
    core.ready()

    async def scenario() -> WorkerReportedError:
        started = asyncio.ensure_future(start_exchange(core.state, order(empty_text="error"),
                                                       Caller()))  # fmt: skip
        job = await core.dispatched()
        core.say(StreamError(job.uid, 422, "empty_text", "nothing to speak", "text"))
        with pytest.raises(WorkerReportedError) as failed:
            await started
        return failed.value

    error = core.run(scenario())
    assert (error.status, error.type) == (422, "empty_text")
    assert (core.records(), core.records("422", "empty_text")) == (1, 1)


@pytest.mark.parametrize("text", ["", "🙂", '<speak><break time="1s"/></speak>'])
def test_nothing_to_speak_known_at_admission_is_silence_no_worker_is_asked_for(
    core: Core, logs: list[structlog.typing.EventDict], text: str
) -> None:
    """Blank, only an emoji, SSML of only a break: no job is sent (no worker is even live), the
    silence goes through the order's encoder (a streamed WAV: its header, then the zeros), and
    its line says ``empty_text`` with a 200 and no worker."""
    speech = order(text, format="wav", sample_rate=24000, ssml=text.startswith("<speak"))

    async def scenario() -> tuple[SynthesisExchange, list[bytes]]:
        exchange, first = await start_exchange(core.state, speech, Caller())
        encoded = [data async for data, _ in exchange.encoded(first)]
        exchange.release_encoder()
        return exchange, encoded

    exchange, encoded = core.run(scenario())
    assert exchange.silent and core.sent() == []
    zeros = bytes(2 * round(SILENCE_S * 24000))
    assert b"".join(encoded) == streaming_header(24000) + zeros
    (line,) = request_lines(logs)
    assert (line["code"], line["status"], line["worker"], line["audio_s"]) == (
        200, "empty_text", None, SILENCE_S)  # fmt: skip
    assert core.value("ttsvc_format_requests_total", {"format": "wav", "api": "synthesize"}) == 1
    assert core.state.inflight == 0 and core.state.idle.is_set()


def test_ssml_of_only_markup_asked_as_an_error_keeps_its_own_422(core: Core) -> None:
    speech = order('<speak><break time="1s"/></speak>', ssml=True, empty_text="error")
    with pytest.raises(NothingToSay, match="only markup"):
        core.run(start_exchange(core.state, speech, Caller()))
    assert core.sent() == []


def test_a_stream_that_ends_without_audio_is_a_500(core: Core) -> None:
    core.ready()

    async def scenario() -> WorkerReportedError:
        started = asyncio.ensure_future(start_exchange(core.state, order(), Caller()))
        job = await core.dispatched()
        core.say(StreamDone(job.uid, 0, compute_s=0.0))
        with pytest.raises(WorkerReportedError) as failed:
            await started
        return failed.value

    assert core.run(scenario()).status == 500
    assert (core.records(), core.records("500", "empty_audio")) == (1, 1)


def test_a_worker_error_after_the_first_audio_cuts_a_streamed_response(core: Core) -> None:
    """The 200 went out with the first audio: the failure is kept for the transport, which must
    not end the response as if it were whole (``cut``), and it is counted as aborted."""
    core.ready()
    caller = Caller()
    job, exchange, _ = core.run(begin(core, order(), caller))
    second = chunk(job.uid, PCM2, 400)
    died = StreamError(job.uid, 503, "worker_died", "the worker exited")
    core.say(second)
    core.say(died)
    assert core.run(gather(exchange.rest())) == [second]
    assert exchange.failure == died and caller.cut
    assert (core.records(), core.records("503", "worker_died")) == (1, 1)
    assert core.value("ttsvc_aborted_streams_total", {"reason": "worker_died"}) == 1
    assert core.state.inflight == 0


def test_a_worker_error_after_the_first_audio_of_a_buffered_order_is_not_a_cut(
    core: Core,
) -> None:
    """Nothing was sent yet: the transport answers with the failure's own status instead."""
    core.ready()
    caller = Caller()
    job, exchange, _ = core.run(begin(core, order(format="wav", stream=False), caller))
    died = StreamError(job.uid, 503, "worker_died", "the worker exited")
    core.say(died)
    assert core.run(gather(exchange.rest())) == []
    assert exchange.failure == died and not caller.cut
    assert core.records("503", "worker_died") == 1
    assert core.value("ttsvc_aborted_streams_total", {"reason": "worker_died"}) is None


def test_a_client_that_leaves_while_queued_is_a_499_and_its_job_is_cancelled(
    core: Core,
) -> None:
    core.ready()

    async def scenario() -> tuple[SynthesisJob, ClientClosedRequest, Caller]:
        left = asyncio.Event()
        caller = Caller(gone=left.wait)
        started = asyncio.ensure_future(start_exchange(core.state, order(), caller))
        job = await core.dispatched()
        left.set()
        with pytest.raises(ClientClosedRequest) as closed:
            await started
        return job, closed.value, caller

    job, error, caller = core.run(scenario())
    assert (error.status, error.type) == (499, "cancelled")
    assert core.sent() == [CancelStream(job.uid)]
    assert (core.records(), core.records("499", "cancelled")) == (1, 1)
    assert core.value("ttsvc_cancellations_total") == 1
    assert caller.recorded and core.state.inflight == 0


def test_no_audio_by_the_queue_deadline_is_a_queue_timeout(
    core: Core, monkeypatch: pytest.MonkeyPatch
) -> None:
    core.ready()
    clock = frozen_loop_clock(core, monkeypatch)

    async def scenario() -> tuple[SynthesisJob, QueueTimeout]:
        started = asyncio.ensure_future(start_exchange(core.state, order(), Caller()))
        job = await core.dispatched()
        clock.now += QUEUE_TIMEOUT_S
        with pytest.raises(QueueTimeout) as late:
            await started
        return job, late.value

    job, error = core.run(scenario())
    assert (error.status, error.type) == (503, "queue_timeout")
    assert core.sent() == [CancelStream(job.uid)]
    assert (core.records(), core.records("503", "queue_timeout")) == (1, 1)
    assert core.value("ttsvc_cancellations_total") == 0  # the service's failure, not the client's


def test_a_stream_silent_past_the_stall_limit_ends_as_stalled(
    core: Core, monkeypatch: pytest.MonkeyPatch
) -> None:
    core.ready()
    caller = Caller()
    job, exchange, _ = core.run(begin(core, order(), caller))
    clock = frozen_loop_clock(core, monkeypatch)

    async def scenario() -> list[AudioChunkMsg]:
        rest = asyncio.ensure_future(gather(exchange.rest()))
        await asyncio.sleep(0)  # it waits for the next chunk
        clock.now += core.settings.worker_silence_timeout_s
        return await rest

    assert core.run(scenario()) == []
    assert exchange.failure is not None and exchange.failure.type == "stalled" and caller.cut
    assert core.sent() == [CancelStream(job.uid)]
    assert core.records("503", "stalled") == 1


def test_the_drain_s_abort_ends_a_stream_in_flight_recorded_once(core: Core) -> None:
    core.ready()
    caller = Caller()
    job, exchange, _ = core.run(begin(core, order(), caller))
    assert core.state.abort_exchanges(ShutDown("the drain's grace is over")) == 1
    assert (core.records(), core.records("503", "shutdown")) == (1, 1)  # at once
    assert core.sent() == [CancelStream(job.uid)]
    assert core.run(gather(exchange.rest())) == []  # woken by the abort
    assert exchange.failure is not None and exchange.failure.type == "shutdown" and caller.cut
    assert core.value("ttsvc_aborted_streams_total", {"reason": "shutdown"}) == 1
    assert core.state.abort_exchanges(ShutDown("again")) == 0 and core.state.aborts == {}
    core.say(StreamDone(job.uid, 400, compute_s=0.1))  # the worker's late end
    assert core.records() == 1 and core.state.inflight == 0


def test_the_drain_s_abort_fails_a_request_still_queued(core: Core) -> None:
    core.ready()

    async def scenario() -> tuple[SynthesisJob, WorkerReportedError]:
        started = asyncio.ensure_future(start_exchange(core.state, order(), Caller()))
        job = await core.dispatched()
        assert core.state.abort_exchanges(ShutDown("the drain's grace is over")) == 1
        with pytest.raises(WorkerReportedError) as failed:
            await started
        return job, failed.value

    job, error = core.run(scenario())
    assert (error.status, error.type) == (503, "shutdown")
    assert core.sent() == [CancelStream(job.uid)]
    assert (core.records(), core.records("503", "shutdown")) == (1, 1)


def test_finish_counts_only_once(core: Core) -> None:
    core.ready()
    caller = Caller()
    job, exchange, _ = core.run(begin(core, order(), caller))
    exchange.finish("ok")
    exchange.finish("cancelled", cancel=True)
    exchange.abort(ShutDown("too late"))
    assert (core.records(), core.records("200", "ok")) == (1, 1)
    assert core.state.inflight == 0 and core.state.idle.is_set()
    assert core.sent() == []  # the later calls sent no cancel
    assert core.value("ttsvc_cancellations_total") == 0
    assert core.state.aborts == {} and job.uid not in core.state.pool.mailboxes  # type: ignore[union-attr]


def test_idle_is_set_only_when_the_last_exchange_ends(core: Core) -> None:
    core.ready()
    _, one, _ = core.run(begin(core, order(), Caller()))
    _, other, _ = core.run(begin(core, order(), Caller()))
    assert core.state.inflight == 2
    one.finish("ok")
    assert core.state.inflight == 1 and not core.state.idle.is_set()
    other.finish("ok")
    assert core.state.inflight == 0 and core.state.idle.is_set()


# --- encoded audio ----------------------------------------------------------------------------


def encoded_stream(
    core: Core, speech: SpeechOrder, *, fail: bool = False
) -> tuple[list[tuple[bytes, AudioChunkMsg | None]], SynthesisExchange, AudioChunkMsg]:
    """An exchange's ``encoded`` output for two chunks (``PCM1``, ``PCM2``), then its end."""
    job, exchange, first = core.run(begin(core, speech, Caller()))
    second = chunk(job.uid, PCM2, 400)
    core.say(second)
    if fail:
        core.say(StreamError(job.uid, 503, "worker_died", "the worker exited"))
    else:
        core.say(StreamDone(job.uid, 700, compute_s=0.1))

    async def collect() -> list[tuple[bytes, AudioChunkMsg | None]]:
        items = [item async for item in exchange.encoded(first)]
        exchange.release_encoder()  # as a transport does, on the loop (it may close off it)
        return items

    return core.run(collect()), exchange, second


def test_streamed_pcm_passes_the_chunks_through_with_an_empty_tail(core: Core) -> None:
    core.ready()
    out, exchange, second = encoded_stream(core, order(format="pcm"))
    assert [data for data, _ in out] == [PCM1, PCM2, b""]
    assert [msg.offset if msg else None for _, msg in out] == [0, 400, None]
    assert out[2][1] is None and out[1][1] == second
    assert exchange.audio_s == (len(PCM1) + len(PCM2)) / 2 / RATE  # every chunk accounted
    assert core.records("200", "ok") == 1


def test_streamed_wav_sends_its_header_with_the_first_audio(core: Core) -> None:
    core.ready()
    out, _, _ = encoded_stream(core, order(format="wav"))
    assert [data for data, _ in out] == [streaming_header(RATE) + PCM1, PCM2, b""]


def test_buffered_wav_is_the_whole_file_in_the_tail(core: Core) -> None:
    core.ready()
    out, _, _ = encoded_stream(core, order(format="wav", stream=False))
    whole = wav_bytes(np.frombuffer(PCM1 + PCM2, dtype="<i2"), RATE)
    assert [data for data, _ in out] == [b"", b"", whole]
    assert whole[:4] == b"RIFF" and whole.endswith(PCM1 + PCM2)


def test_a_failed_stream_yields_no_tail(core: Core) -> None:
    """An encoder's tail (a WAV file, a codec's flush) would make a failed stream look whole."""
    core.ready()
    out, exchange, _ = encoded_stream(core, order(format="pcm"), fail=True)
    assert [data for data, _ in out] == [PCM1, PCM2]
    assert exchange.failure is not None and exchange.failure.type == "worker_died"
