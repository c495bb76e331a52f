"""structlog configured for one JSON object per line, the format Loki ingests as is.

Configured by the entry point (``ttsvc.cli``) and by each worker process, never at import.
Standard-library loggers (uvicorn's access and error logs, libraries) go through the same
renderer, so every line of the service parses as JSON. User text is never logged (only its
length), and JSON escaping keeps control characters from breaking a line.
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


def configure_logging(level: str = "info", stream: TextIO | None = None) -> None:
    """JSON lines to ``stream`` (default stderr, so a command's own output keeps stdout)."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        numeric = logging.INFO
    out = stream or sys.stderr
    structlog.configure(
        processors=[*_SHARED, structlog.processors.format_exc_info,
                    structlog.processors.JSONRenderer()],
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
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(),
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []  # propagate to the JSON handler
        logging.getLogger(name).propagate = True


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    """A logger that tags every event with the component name.

    Lazy: modules call this at import, before ``configure_logging`` runs (a spawned worker
    imports them first), so the configuration is looked up at the first log call.
    """
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger(component=name)
    return logger
