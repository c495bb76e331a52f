"""The error table: one status and one type per error, and streams report errors through it."""

from __future__ import annotations

from ttsvc import errors
from ttsvc.protocol import StreamError


def _table() -> list[type[errors.TTSError]]:
    found = []
    for value in vars(errors).values():
        if isinstance(value, type) and issubclass(value, errors.TTSError):
            found.append(value)
    return found


def test_every_error_names_one_type_and_a_client_or_server_status() -> None:
    table = _table()
    assert errors.NoWorkerAvailable in table and errors.WorkerLost in table
    types = [cls.type for cls in table]
    assert len(types) == len(set(types)), sorted(t for t in types if types.count(t) > 1)
    assert all(400 <= cls.status < 600 for cls in table)


def test_a_stream_error_takes_status_type_and_field_from_the_error() -> None:
    sent = StreamError.of("u1", errors.TextTooLong("text is too long", field="text"))
    assert sent == StreamError("u1", 422, "text_too_long", "text is too long", "text")
    lost = StreamError.of("u2", errors.WorkerStalled("the worker stopped responding"))
    assert (lost.status, lost.type, lost.field) == (503, "stalled", None)
