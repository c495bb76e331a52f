"""The benchmarks' one percentile function, and the small arithmetic around it.

Why this exists: a percentile computed two ways in two scripts makes their tables disagree on
the same data. Every script calls ``pct``; the interpolation is a parameter, so a caller whose
published numbers use another method (the balancer simulation's nearest rank) keeps it, visibly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np

Method = Literal["linear", "nearest_rank"]


def pct(values: Sequence[float], q: float, method: Method = "linear") -> float | None:
    """The ``q``-th percentile of ``values``; None where there are no values.

    ``linear``: numpy's default linear interpolation between the two nearest ranks (every
    benchmark but one). ``nearest_rank``: the value at rank ``ceil(q / 100 * n)`` of the sorted
    values, never interpolated (``balancer_sim``'s tables).
    """
    if len(values) == 0:
        return None
    if method == "nearest_rank":
        ordered = sorted(values)
        rank = max(1, math.ceil(q / 100.0 * len(ordered)))
        return ordered[rank - 1]
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None where either is missing or b is zero."""
    if a is None or b is None or b == 0:
        return None
    return a / b


def finite(value: float | None) -> bool:
    """True for a real number (not None, NaN or infinite)."""
    return value is not None and math.isfinite(value)
