"""Writing results: table cells, markdown tables, strict JSON, atomic files, raw records, and
the sections of a sectioned benchmark merged into its JSON.

Why this exists: every script prints a markdown table and stores a JSON document; one writer
keeps the cells, the NaN handling and the atomic rename the same everywhere, and keeps the
large per-request records out of the committed results (they go to git-ignored
``results/raw/``, next to the summary that names them).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench_common.context import utc_timestamp

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


def sections_parser(doc: str, sections: Sequence[str], engines: Path) -> argparse.ArgumentParser:
    """The argument parser of a sectioned benchmark with the flags they all take: ``--only``
    (the sections to run) and ``--engines-dir`` (``engines`` by default)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n", maxsplit=1)[0])
    p.add_argument("--only", default=",".join(sections),
                   help=f"sections to run, comma-separated, of {','.join(sections)} "
                   "(default all)")  # fmt: skip
    p.add_argument("--engines-dir", type=Path, default=engines,
                   help="engine repository; the default voice is compiled here if missing")
    return p


def chosen_sections(only: str, sections: Sequence[str]) -> list[str]:
    """The sections an ``--only a,b`` value names, in the order given; exits on a name that is
    none of ``sections``."""
    chosen = [s.strip() for s in only.split(",") if s.strip()]
    unknown = sorted(set(chosen) - set(sections))
    if unknown or not chosen:
        raise SystemExit(f"--only: unknown sections {unknown}; choose from {', '.join(sections)}")
    return chosen


def run_sections(
    path: Path,
    benchmark: str,
    machine: Mapping[str, Any],
    runners: Mapping[str, Callable[[], dict[str, Any]]],
    chosen: Sequence[str],
    settings: Mapping[str, Any] | None = None,
) -> None:
    """Run the ``chosen`` sections of a sectioned benchmark, in ``runners``' order, each under a
    ``## name`` heading, and merge their results (dated, and with ``settings`` where given) into
    the JSON at ``path``, keeping the sections an earlier run left there."""
    sections: dict[str, Any] = {}
    if path.exists():
        sections = json.loads(path.read_text(encoding="utf-8")).get("sections", {})
    for name, run in runners.items():
        if name not in chosen:
            continue
        print(f"## {name}\n", flush=True)
        result = run()
        result["date"] = utc_timestamp()
        if settings is not None:
            result["settings"] = dict(settings)
        sections[name] = result
    write_json(path, {"benchmark": benchmark, "machine": dict(machine), "sections": sections},
               allow_nan=False)  # fmt: skip
