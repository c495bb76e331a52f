"""The reliability benchmark's own bookkeeping, on synthetic inputs: the fuzz texts it draws, and
how it reads server logs, WAV bodies and child exits. A slip here misreports every table."""

from __future__ import annotations

import json
import signal

import pytest

from reliability_bench import (
    FUZZ_MAX_CHARS,
    REPR_CHARS,
    error_lines,
    fuzz_texts,
    log_events,
    shown,
    signal_name,
    wav_audio_s,
)


def test_fuzz_texts_are_reproducible_bounded_and_include_long_repeats() -> None:
    texts = fuzz_texts(7, 200)
    assert texts == fuzz_texts(7, 200)
    assert texts != fuzz_texts(8, 200)
    assert all(0 < len(t) <= FUZZ_MAX_CHARS for t in texts)
    # the shapes that crashed espeak-ng were one short unit repeated: the draw must make them
    repeats = [t for t in texts if len(t) >= 40 and any(t == t[:k] * (len(t) // k)
                                                        for k in range(1, 17))]  # fmt: skip
    assert len(repeats) >= 40


def test_log_counting_reads_json_lines_and_survives_the_rest() -> None:
    died = json.dumps({"worker": 0, "event": "worker_died", "level": "warning"})
    done = json.dumps({"status": "worker_died", "event": "request", "level": "info"})
    failed = json.dumps({"event": "boom", "level": "error"})
    lines = [died, done, failed, "Traceback (most recent call last):", "  File 'x', line 1"]
    assert log_events(lines, "worker_died") == 1  # a request's status is not a death
    assert error_lines(lines) == [failed, "Traceback (most recent call last):"]


def test_wav_audio_seconds_come_from_the_header_rate() -> None:
    header = b"RIFF" + bytes(20) + (22050).to_bytes(4, "little") + bytes(16)
    assert wav_audio_s(header + bytes(2 * 22050)) == pytest.approx(1.0)
    assert wav_audio_s(header) == 0.0
    assert wav_audio_s(b'{"error": "x"}') == 0.0


def test_child_exits_and_long_texts_read_as_table_cells() -> None:
    assert signal_name(-signal.SIGSEGV) == "SIGSEGV"
    assert signal_name(1) == "exit 1"
    assert shown("a." * 10) == repr("a." * 10)
    cut = shown("a." * 500)
    assert len(cut) == REPR_CHARS and cut.endswith("…")
