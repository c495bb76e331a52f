"""Where a benchmark run happens and what it reads: paths, the corpus, the machine, the date.

Why this exists: every result file records the machine and date the same way and every load
uses the same corpus bounds, so results from different scripts can be read side by side.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
"""``benchmarks/``."""
ROOT = HERE.parent
DEFAULT_CORPUS = HERE / "corpus.txt"
DEFAULT_ENGINES = HERE / ".cache" / "engines"
SERVER_LOG_DIR = HERE / ".cache"
"""Server stdout/stderr go to a file here: a pipe nobody reads would block the server."""
RESULTS = HERE / "results"
"""Committed results: settings, machine, summaries, tables (per-request records go to the
git-ignored ``raw/`` below it: ``report.write_raw``)."""

MIN_CHARS, MAX_CHARS = 20, 60
"""Corpus line length bounds: short voice-bot / phone-menu prompts (the issues' 20-60-character
texts), one sentence each; every target the benchmarks check assumes this workload."""


def relative(path: Path) -> str:
    """Paths in results are repository-relative so no machine's layout is committed."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return Path(path).name


def load_corpus(path: Path) -> list[str]:
    """Read one prompt per line; the length bounds keep the workload what the targets assume.

    A line out of bounds, or an empty corpus, stops the run with the offending line named.
    """
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    lines = [line for line in lines if line]
    for number, line in enumerate(lines, start=1):
        if not MIN_CHARS <= len(line) <= MAX_CHARS:
            raise SystemExit(
                f"{path}:{number}: {len(line)} characters, want {MIN_CHARS}-{MAX_CHARS}: {line!r}"
            )
    if not lines:
        raise SystemExit(f"{path}: no prompts")
    return lines


def cpu_model() -> str:
    """``platform.processor()`` is often empty on Linux; /proc/cpuinfo names the CPU."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return ""


def machine_info(versions: Mapping[str, str], *, with_cpu_model: bool = True) -> dict[str, Any]:
    """What the numbers depend on; printed as the header and stored in the JSON.

    ``versions`` are the library versions the caller depends on, in the order its JSON lists
    them (each script passes its own, so this module does not import ONNX Runtime).
    ``with_cpu_model=False`` leaves out ``cpu_model`` for results whose schema never had it.
    """
    info: dict[str, Any] = {"processor": platform.processor()}
    if with_cpu_model:
        info["cpu_model"] = cpu_model()
    info.update(
        {
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        }
    )
    info.update(versions)
    return info


def utc_timestamp() -> str:
    """The run's date as stored in the JSON: UTC, ISO 8601, whole seconds."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
