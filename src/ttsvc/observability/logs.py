"""structlog configured for one JSON object per line, the format Loki ingests as is, or for
human-readable lines when a person is watching a terminal.

Configured by the entry point (``ttsvc.cli``) and by each worker process, never at import.
Standard-library loggers (uvicorn's access and error logs, libraries) go through the same
renderer, so in JSON mode every line of the service parses as JSON. The console format shows the
same events and fields, only laid out for reading. User text is never logged (only its length),
and JSON escaping keeps control characters from breaking a line.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

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


def configure_logging(
    level: str = "info", stream: TextIO | None = None, log_format: str = "auto"
) -> None:
    """Log lines to ``stream`` (default stderr, so a command's own output keeps stdout), in
    the format ``log_format`` (``auto``, ``json`` or ``console``) resolves to for it."""
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
    structlog.configure(
        processors=[*_SHARED, *tail],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )  # fmt: skip
    handler = logging.StreamHandler(out)
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


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    """A logger that tags every event with the component name.

    Lazy: modules call this at import, before ``configure_logging`` runs (a spawned worker
    imports them first), so the configuration is looked up at the first log call.
    """
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger(component=name)
    return logger
