"""The benchmark scripts import their helpers as top-level modules (``python benchmarks/x.py``
puts ``benchmarks/`` first on ``sys.path``); the tests import them the same way."""

from __future__ import annotations

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))
