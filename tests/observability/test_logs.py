"""Log format: readable lines for a person at a terminal, JSON lines for everything else."""

from __future__ import annotations

import fcntl
import io
import json
import logging
import os
import pty
import select
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import TextIO

import pytest
import structlog

from ttsvc.observability.logs import LineSink, configure_logging, get_logger

F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Linux; Python 3.10+ names it

FIELDS = {"uid": "req-7", "qsize": 3, "latency": 0.125, "text_len": 42}
"""Fields the dashboards' Loki queries read."""


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    structlog.reset_defaults()
    root.handlers[:], root.level = handlers, level


@pytest.fixture
def terminal() -> Iterator[tuple[TextIO, int]]:
    """A real pseudo-terminal: the stream end a process writes to, and the end a screen reads."""
    screen, tty = pty.openpty()
    with os.fdopen(tty, "w", buffering=1) as stream:
        yield stream, screen
    os.close(screen)


def _emit() -> None:
    get_logger("gateway").info("request_done", **FIELDS)
    logging.getLogger("uvicorn.error").info("Started server process")


def _screen(screen: int, count: int = 2) -> list[str]:
    """The next ``count`` lines on the terminal (a pty may hand them over in pieces)."""
    text = ""
    while text.count("\n") < count:
        ready, _, _ = select.select([screen], [], [], 10)
        assert ready, f"the terminal showed only {text!r}"
        text += os.read(screen, 65536).decode()
    return [line for line in text.replace("\r", "").splitlines() if line]


def _json_lines(lines: list[str]) -> list[dict[str, object]]:
    return [json.loads(line) for line in lines]


def test_a_terminal_gets_readable_lines(terminal: tuple[TextIO, int]) -> None:
    stream, screen = terminal
    configure_logging("info", stream)
    _emit()
    lines = _screen(screen)
    assert len(lines) == 2
    for line in lines:
        with pytest.raises(json.JSONDecodeError):
            json.loads(line)
    assert "request_done" in lines[0] and "\x1b[" in lines[0]  # colored for the screen
    for name in FIELDS:
        assert name in lines[0]
    assert "Started server process" in lines[1]


def test_a_file_gets_json_with_the_dashboards_fields() -> None:
    with tempfile.TemporaryFile("w+") as stream:
        configure_logging("info", stream)
        _emit()
        stream.seek(0)
        done, started = _json_lines(stream.read().splitlines())
    assert done["event"] == "request_done" and done["component"] == "gateway"
    assert {k: done[k] for k in FIELDS} == FIELDS
    assert started["event"] == "Started server process" and started["logger"] == "uvicorn.error"


def test_the_setting_forces_either_format(terminal: tuple[TextIO, int]) -> None:
    stream, screen = terminal
    configure_logging("info", stream, "json")
    _emit()
    done = _json_lines(_screen(screen))[0]
    assert {k: done[k] for k in FIELDS} == FIELDS
    with tempfile.TemporaryFile("w+") as file:
        configure_logging("info", file, "console")
        _emit()
        file.seek(0)
        lines = file.read().splitlines()
    assert len(lines) == 2 and "request_done" in lines[0] and "uid=req-7" in lines[0]
    assert not lines[0].startswith("{")


STRAY = """
import os, sys, threading, warnings
from ttsvc.observability.logs import capture_stray_output, configure_logging
configure_logging("info", sys.stdout, "json")
relay = capture_stray_output(native=True)
warnings.warn("a library's warning")
print("plain text on stderr", file=sys.stderr)
os.write(2, b"a native library's line\\n")
thread = threading.Thread(target=lambda: 1 / 0, name="compute-1")
thread.start()
thread.join()
relay.close()
raise RuntimeError("the end of the process")
"""


def test_every_line_a_json_process_writes_is_a_json_object() -> None:
    """What used to reach the log stream raw: a Python warning, text printed to stderr, a
    native library's line, a thread's exception, the process's own last traceback."""
    result = subprocess.run([sys.executable, "-c", STRAY], capture_output=True, text=True,
                            timeout=60, check=False)  # fmt: skip
    assert result.returncode == 1
    assert result.stderr == ""
    lines = _json_lines(result.stdout.splitlines())
    by_event = {str(line["event"]): line for line in lines}
    assert "a library's warning" in str(by_event)  # logged through py.warnings
    assert by_event["stderr"]["line"] == "plain text on stderr"
    assert by_event["native_stderr"]["line"] == "a native library's line"
    assert "ZeroDivisionError" in str(by_event["thread_exception"]["exception"])
    assert by_event["thread_exception"]["thread"] == "compute-1"
    last = by_event["uncaught_exception"]
    assert "RuntimeError: the end of the process" in str(last["exception"])
    assert last["level"] == "critical"


WRITER = """
import logging, sys
from ttsvc.observability.logs import LineSink, configure_logging, get_logger
configure_logging("info", sys.stdout, "json")
sys.stdin.read()  # all writers start together: the parent closes their stdin at once
log, std = get_logger("worker"), logging.getLogger("uvicorn.access")
for n in range(int(sys.argv[1])):
    log.info("request", uid=f"{sys.argv[2]}-{n}", detail="x" * (n % 7) * 600)
    std.info("access %s-%d", sys.argv[2], n)
"""


def test_lines_of_several_processes_through_one_pipe_stay_whole() -> None:
    """Writers share one pipe, as the gateway and its workers share a container's stdout: the
    pipe's buffer made as small as Linux allows (one page), so that writes block, and lines up
    to the 4 KiB a pipe keeps whole in one write (a buffered stream split such lines where its
    buffer filled). Every line read must be one JSON object, and every event must be there
    once."""
    read, write = os.pipe()
    fcntl.fcntl(write, F_SETPIPE_SZ, 4096)
    count, writers = 150, 4
    command = [sys.executable, "-c", WRITER, str(count)]
    procs = [subprocess.Popen([*command, f"w{k}"], stdin=subprocess.PIPE, stdout=write)
             for k in range(writers)]  # fmt: skip
    os.close(write)
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.close()
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    for proc in procs:
        assert proc.wait(timeout=60) == 0
    lines = data.decode().splitlines()
    events = [json.loads(line) for line in lines]  # a broken line fails here
    uids = sorted(str(e["uid"]) for e in events if e["event"] == "request")
    assert uids == sorted(f"w{k}-{n}" for k in range(writers) for n in range(count))
    assert sum(1 for e in events if e.get("logger") == "uvicorn.access") == writers * count


class _Reentering(io.StringIO):
    """A stream on a pipe's write end whose flush logs a line of its own, once: what a
    finalizer run by the garbage collector in the middle of a write does."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self.fd = fd
        self.sink: LineSink | None = None

    def fileno(self) -> int:
        return self.fd

    def flush(self) -> None:
        sink, self.sink = self.sink, None
        if sink is not None:
            sink.write_line('{"event": "inner"}')


def _in_thread(call: Callable[[], None]) -> bool:
    """Whether ``call`` returned (within a minute: a deadlock would never)."""
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(timeout=60)
    return not thread.is_alive()


def test_a_line_logged_during_a_write_follows_it() -> None:
    read, write = os.pipe()
    stream = _Reentering(write)
    sink = stream.sink = LineSink(stream)
    assert _in_thread(lambda: sink.write_line('{"event": "outer"}'))
    os.close(write)
    with os.fdopen(read) as pipe:
        assert [json.loads(line)["event"] for line in pipe] == ["outer", "inner"]
