"""Writing results: table cells, markdown tables, strict JSON, atomic files, raw records.

Why this exists: every script prints a markdown table and stores a JSON document; one writer
keeps the cells, the NaN handling and the atomic rename the same everywhere, and keeps the
large per-request records out of the committed results (they go to git-ignored
``results/raw/``, next to the summary that names them).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ALIGN = {"l": "---", "r": "---:"}
"""``markdown_table`` column alignment letters: left (text) or right (numbers)."""


def fmt(value: float | None, digits: int = 1) -> str:
    """A table cell: fixed digits, or an en dash where there is no value."""
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value:.{digits}f}"


def markdown_table(header: Sequence[str], align: str, rows: Iterable[Sequence[str]]) -> str:
    """A markdown table, no trailing newline: ``| a | b |`` lines under a separator row.

    ``align`` has one letter per column, ``l`` or ``r`` (see ``ALIGN``); cells come formatted.
    """
    if len(align) != len(header):
        raise ValueError(f"{len(header)} columns, {len(align)} alignments")
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(ALIGN[a] for a in align) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def clean(value: Any) -> Any:
    """NaN and infinities to None, recursively: the JSON must be strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean(v) for v in value]
    return value


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through ``<path>.tmp`` and a rename (results/*.tmp is
    git-ignored), so an interrupted run never leaves a half-written result behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def write_json(
    path: Path,
    doc: Any,
    *,
    indent: int = 1,
    clean_nan: bool = True,
    allow_nan: bool = True,
    ensure_ascii: bool = True,
    newline: bool = True,
) -> None:
    """``doc`` as JSON at ``path``, atomically.

    The options are the scripts' existing formats, kept so no result file changes shape:
    ``clean_nan`` maps NaN to null first; ``allow_nan=False`` makes any NaN left an error;
    ``newline`` ends the file with one.
    """
    text = json.dumps(
        clean(doc) if clean_nan else doc,
        indent=indent,
        allow_nan=allow_nan,
        ensure_ascii=ensure_ascii,
    )
    write_atomic(path, text + ("\n" if newline else ""))


def raw_path(result: Path) -> Path:
    """Where the raw records of the result at ``result`` go: ``raw/`` beside it, same name."""
    return result.parent / "raw" / result.name


def write_raw(result: Path, records: Any) -> Path:
    """Write per-request ``records`` beside the result at ``result`` (see ``raw_path``) as
    strict JSON, and return their path for the summary to name."""
    path = raw_path(result)
    write_json(path, records, allow_nan=False)
    return path
