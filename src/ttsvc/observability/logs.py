"""structlog configured for one JSON object per line, the format Loki ingests as is, or for
human-readable lines when a person is watching a terminal.

Configured by the entry point (``ttsvc.cli``) and by each worker process, never at import.
Standard-library loggers (uvicorn's access and error logs, libraries) go through the same
renderer, so in JSON mode every line of the service parses as JSON. Every line, from either, is
one ``write`` of the line and its newline to the stream's descriptor (``LineSink``): the
gateway and its workers share that descriptor, and a pipe (how a container runtime collects
logs) interleaves what several processes write in pieces. The console format shows the
same events and fields, only laid out for reading. User text is never logged (only its length),
and JSON escaping keeps control characters from breaking a line.
"""

from __future__ import annotations

import io
import logging
import os
import select
import sys
import threading
from types import TracebackType
from typing import Any, TextIO

import structlog

_SHARED: list[structlog.typing.Processor] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


def is_terminal(stream: TextIO) -> bool:
    """Whether a person is likely reading ``stream`` live (a closed or odd stream: no)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def resolve_format(log_format: str, stream: TextIO) -> str:
    """``json`` or ``console``: ``auto`` picks console only for a terminal, since pipes, files
    and containers feed log collectors that parse JSON."""
    if log_format == "auto":
        return "console" if is_terminal(stream) else "json"
    return log_format


class LineSink:
    """Writes whole log lines to one stream, each in a single ``write`` to its descriptor.

    Why: every process of the service logs to the same inherited descriptor. structlog's
    ``PrintLogger`` wrote the message and the newline apart, and a buffered text stream splits
    long lines where its buffer fills, so through a pipe (a container runtime's) another
    process's line landed inside one. Here a line is encoded once and written in one call under
    a thread lock: a pipe keeps such a write whole up to ``PIPE_BUF`` (4 KiB, every line the
    service writes but a long traceback), and a file opened for appending keeps every write
    whole. No lock is shared between processes: the gateway's event loop would then wait on a
    worker that took it and was kept from running (by its GIL, the scheduler, a SIGSTOP), which
    stalled streams; a traceback longer than ``PIPE_BUF`` through a pipe may therefore still be
    cut by another process's line, where a short line never is.

    A line logged while this thread is inside ``write_line`` (a finalizer run by the garbage
    collector mid-write) follows the line in progress. Where the stream has no descriptor (a
    test's ``StringIO``), it is written through the stream. A write that fails (the reader went
    away) is dropped: a log line must never fail the request it describes.

    Lives in every process of the service; used from any thread."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self._lock = threading.Lock()
        self._local = threading.local()
        self._fd: int | None
        try:
            self._fd = stream.fileno()
        except (AttributeError, OSError, ValueError):
            self._fd = None
        self._encoding = getattr(stream, "encoding", None) or "utf-8"

    def write_line(self, line: str) -> None:
        """``line`` and a newline, as one write."""
        text = line if line.endswith("\n") else line + "\n"
        pending: list[str] | None = getattr(self._local, "pending", None)
        if pending is not None:  # re-entered on this thread: after the line in progress
            pending.append(text)
            return
        with self._lock:
            self._local.pending = queued = [text]
            try:
                while queued:
                    self._write(queued.pop(0))
            finally:
                self._local.pending = None

    def _write(self, text: str) -> None:
        try:
            if self._fd is None:
                self.stream.write(text)
                self.stream.flush()
                return
            data = memoryview(text.encode(self._encoding, "backslashreplace"))
            self.stream.flush()  # what was printed before keeps its place
            while data:
                try:
                    data = data[os.write(self._fd, data):]
                except BlockingIOError:  # a descriptor left non-blocking
                    select.select([], [self._fd], [], 1.0)
        except (OSError, ValueError):  # the reader went away, or the stream was closed
            pass


class LineLogger:
    """structlog's final logger over a ``LineSink``: every level is one whole line."""

    def __init__(self, sink: LineSink) -> None:
        self._sink = sink

    def msg(self, message: str) -> None:
        self._sink.write_line(message)

    log = debug = info = warn = warning = msg
    err = error = critical = exception = fatal = failure = msg


class LineHandler(logging.Handler):
    """The standard library's records (uvicorn, libraries), formatted and written through the
    same ``LineSink`` as structlog's events, so that they are whole lines too."""

    def __init__(self, sink: LineSink) -> None:
        super().__init__()
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.sink.write_line(self.format(record))
        except Exception:
            self.handleError(record)


def configure_logging(
    level: str = "info", stream: TextIO | None = None, log_format: str = "auto"
) -> str:
    """Log lines to ``stream`` (default stderr, so a command's own output keeps stdout), in
    the format ``log_format`` (``auto``, ``json`` or ``console``) resolves to for it; returns
    that format."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        numeric = logging.INFO
    out = stream or sys.stderr
    tail: list[structlog.typing.Processor]
    if resolve_format(log_format, out) == "console":
        # the console renderer lays out exceptions itself (format_exc_info would flatten them)
        tail = [structlog.dev.ConsoleRenderer(colors=is_terminal(out))]
    else:
        tail = [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    sink = LineSink(out)

    def line_logger(*_args: Any) -> LineLogger:
        return LineLogger(sink)

    structlog.configure(
        processors=[*_SHARED, *tail],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=line_logger,
        cache_logger_on_first_use=False,
    )  # fmt: skip
    handler = LineHandler(sink)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*_SHARED, structlog.stdlib.add_logger_name],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                *tail,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []  # propagate to the handler above
        logging.getLogger(name).propagate = True
    return resolve_format(log_format, out)


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    """A logger that tags every event with the component name.

    Lazy: modules call this at import, before ``configure_logging`` runs (a spawned worker
    imports them first), so the configuration is looked up at the first log call.
    """
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger(component=name)
    return logger


class _JsonLines(io.TextIOBase):
    """A text stream whose every complete line becomes one log event (``event``: ``name``,
    the text in ``line``): what is left of ``sys.stderr`` once exceptions and warnings have
    their own events, so that nothing a process prints breaks its JSON log."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self._name = name
        self._pending = ""
        self._lock = threading.Lock()
        self._log = get_logger("process")

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self._lock:
            self._pending += text
            *lines, self._pending = self._pending.split("\n")
        for line in lines:
            if line.strip():
                self._log.warning(self._name, line=line)
        return len(text)


def _log_uncaught(kind: type[BaseException], value: BaseException,
                  tb: TracebackType | None) -> None:  # fmt: skip
    get_logger("process").critical("uncaught_exception", exc_info=(kind, value, tb))


def _log_thread_exception(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return  # as the default hook: a thread that exits on purpose
    assert args.exc_value is not None
    get_logger("process").error(
        "thread_exception", thread=args.thread.name if args.thread else None,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback))  # fmt: skip


class NativeRelay:
    """File descriptor 2 made a pipe, whose lines a thread turns into log events: what native
    libraries write there (ONNX Runtime's own logger) joins the JSON log. ``close`` puts the old
    descriptor back and waits for the lines still in the pipe, so a process that ends on purpose
    loses none (one that dies abruptly may)."""

    def __init__(self) -> None:
        self._saved = os.dup(2)
        read, write = os.pipe()
        os.dup2(write, 2)
        os.close(write)
        self._thread = threading.Thread(target=self._relay, args=(read,), name="stderr-relay",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    @staticmethod
    def _relay(fd: int) -> None:
        log = get_logger("process")
        with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as pipe:
            for line in pipe:
                if line.strip():
                    log.warning("native_stderr", line=line.rstrip("\n"))

    def close(self, timeout: float = 2.0) -> bool:
        """Restore file descriptor 2 and relay what is left in the pipe (bounded wait); returns
        whether the relay reached the pipe's end. A child process started meanwhile holds a
        write end of its own until it exits (the worker stops its espeak-ng child first)."""
        os.dup2(self._saved, 2)  # our last write end closes: the relay reads to the pipe's end
        os.close(self._saved)
        self._thread.join(timeout)
        return not self._thread.is_alive()


def capture_stray_output(native: bool = False) -> NativeRelay | None:
    """Make what a process writes outside its logger into log events, for a JSON log: an
    uncaught exception (in any thread) is one event with its traceback inside, a Python
    warning goes through ``logging``, and any other line written to ``sys.stderr`` is an
    event of its own. ``native``: also what native libraries write to file descriptor 2,
    through a ``NativeRelay`` (returned: close it before the process ends).

    Called by the service's processes after ``configure_logging`` chose JSON, never at import.
    """
    sys.excepthook = _log_uncaught
    threading.excepthook = _log_thread_exception
    logging.captureWarnings(True)
    sys.stderr = _JsonLines("stderr")
    return NativeRelay() if native else None
