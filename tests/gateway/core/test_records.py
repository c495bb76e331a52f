"""The completion record of a request refused before dispatch (``record_refusal``).

Every synthesis request ends in exactly one completion line and one count in
``ttsvc_requests_total``, whether an exchange wrote it or an error handler did; a dashboard that
counts twice, or misses a refusal, misreports the error rate. Before these tests the rule was
checked only through a real server's log.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import structlog

from tests.gateway.core.conftest import Core, chunk, order
from ttsvc.errors import Busy, TextTooLong
from ttsvc.gateway.core.caller import Caller
from ttsvc.gateway.core.exchange import start_exchange
from ttsvc.gateway.core.keys import ApiKey
from ttsvc.gateway.core.quotas import Quota
from ttsvc.gateway.core.records import record_refusal


@pytest.fixture
def logs() -> Iterator[list[structlog.typing.EventDict]]:
    with structlog.testing.capture_logs() as captured:
        yield captured


def request_lines(logs: list[structlog.typing.EventDict]) -> list[structlog.typing.EventDict]:
    return [entry for entry in logs if entry["event"] == "request"]


BUSY = Busy("all stream slots are busy, retry shortly")


def test_a_refusal_is_recorded_once_and_its_uid_returned(
    core: Core, logs: list[structlog.typing.EventDict]
) -> None:
    caller = Caller()
    uid = record_refusal(core.state, caller, BUSY.to_body(), BUSY.status)
    assert (core.records(), core.records("429", "overloaded")) == (1, 1)
    assert core.value("ttsvc_rejections_total", {"reason": "overloaded"}) == 1
    (line,) = request_lines(logs)
    assert line["uid"] == uid and len(uid) == 32
    assert (line["code"], line["status"], line["error_type"]) == (429, "overloaded", "overloaded")
    assert (line["worker"], line["audio_s"], line["voice"]) == (None, 0.0, "voice")
    assert caller.recorded and caller.request_id == uid


def test_a_second_refusal_of_the_same_request_is_not_recorded(
    core: Core, logs: list[structlog.typing.EventDict]
) -> None:
    caller = Caller()
    uid = record_refusal(core.state, caller, BUSY.to_body(), BUSY.status)
    again = TextTooLong("text is over 40 characters", field="text")
    assert record_refusal(core.state, caller, again.to_body(), again.status) == uid
    assert core.records() == 1 and core.records("422") == 0
    assert len(request_lines(logs)) == 1


def test_the_record_carries_the_key_s_name_the_format_and_the_text_length(
    core: Core, logs: list[structlog.typing.EventDict]
) -> None:
    caller = Caller(key=ApiKey("alice", bytes(32), Quota()), labels={"format": "mp3"})
    caller.text_len = 12
    record_refusal(core.state, caller, BUSY.to_body(), BUSY.status)
    (line,) = request_lines(logs)
    assert (line["key"], line["format"], line["text_len"]) == ("alice", "mp3", 12)
    assert "alice" not in str(core.pool.metrics.registry.collect())  # names stay out of metrics


def test_a_request_without_key_or_format_records_them_as_none(
    core: Core, logs: list[structlog.typing.EventDict]
) -> None:
    record_refusal(core.state, Caller(), BUSY.to_body(), BUSY.status)
    (line,) = request_lines(logs)
    assert (line["key"], line["format"]) == (None, None)


def test_an_error_after_an_exchange_recorded_the_request_names_its_uid(
    core: Core, logs: list[structlog.typing.EventDict]
) -> None:
    """A response that fails after its exchange finished (the body could not be written, say)
    is answered with the exchange's uid, and not counted a second time."""
    core.ready()
    caller = Caller()

    async def scenario() -> str:
        started = asyncio.ensure_future(start_exchange(core.state, order(), caller))
        job = await core.dispatched()
        core.say(chunk(job.uid, b"\x00\x00" * 10))
        exchange, _ = await started
        exchange.finish("ok")
        return job.uid

    uid = core.run(scenario())
    assert record_refusal(core.state, caller, BUSY.to_body(), BUSY.status) == uid
    assert core.records() == 1 and core.records("200", "ok") == 1
    assert [line["uid"] for line in request_lines(logs)] == [uid]
