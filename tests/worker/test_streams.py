"""The stream record every scheduler keeps, and what it tells the gateway: the queue wait on the
first chunk only, one final message, and an error's public form (a bug's type, never its text)."""

from __future__ import annotations

import numpy as np
import pytest

from ttsvc.errors import AudioTooLong
from ttsvc.protocol import AudioChunkMsg, FromWorker, StreamDone, StreamError, SynthesisJob
from ttsvc.synthesis import AudioChunk, Synthesizer
from ttsvc.worker.streams import ActiveStream


def stream(synth: Synthesizer) -> ActiveStream:
    return ActiveStream(SynthesisJob("s", "Hello.", 1.0, 0.0, 0.0, 0.2), synth, arrived=10.0)


def chunk(offset: int, size: int, last: bool = False) -> AudioChunk:
    return AudioChunk(np.full(size, 7, dtype=np.int16), offset, 0, last)


def test_only_the_first_chunk_reports_the_queue_wait(synth: Synthesizer) -> None:
    s = stream(synth)
    s.started_at = 10.25
    sent: list[FromWorker] = []
    for offset, now in ((0, 11.0), (100, 12.0)):
        piece = chunk(offset, 100)
        s.send_chunk(piece, piece.samples, 0.01, now, sent.append)
    first, second = sent
    assert isinstance(first, AudioChunkMsg) and isinstance(second, AudioChunkMsg)
    assert (first.queued_s, second.queued_s) == (0.25, 0.0)
    assert first.engine_version == synth.engines.label and len(first.pcm) == 200
    assert s.first_sent_at == 11.0 and s.samples_sent == 200
    s.send_done(sent.append)
    assert sent[-1] == StreamDone("s", 200, 0.0) == s.final()


@pytest.mark.parametrize(
    ("error", "status", "message"),
    [(AudioTooLong("too long", field="text"), 422, "too long"),
     (KeyError("a secret"), 500, "synthesis failed: KeyError")],
)  # fmt: skip
def test_an_error_ends_the_stream_in_its_public_form(
    synth: Synthesizer, error: Exception, status: int, message: str
) -> None:
    sent: list[FromWorker] = []
    try:
        raise error
    except Exception as exc:
        stream(synth).send_error(exc, sent.append)
    assert len(sent) == 1 and isinstance(sent[0], StreamError)
    assert (sent[0].status, sent[0].message) == (status, message)

