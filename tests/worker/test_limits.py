"""A worker's own memory bounds, applied in a real child process: an allocation past the cap
fails there (and only there), and the child ranks above its parent for the OOM killer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CHILD = """
import sys
import numpy as np
from ttsvc.worker.limits import limit_memory
limit_memory(int(sys.argv[1]) << 20)
small = np.ones(16 << 20, dtype=np.uint8)  # well under the cap: fine
try:
    np.empty(1 << 30, dtype=np.uint8)  # a runaway allocation (its mapping is what counts)
except MemoryError:
    print("refused")
print(open("/proc/self/oom_score_adj").read().strip())
"""


@pytest.mark.skipif(not Path("/proc/self/oom_score_adj").exists(), reason="Linux /proc only")
def test_past_its_cap_an_allocation_fails_and_the_oom_killer_prefers_the_worker() -> None:
    parent = int(Path("/proc/self/oom_score_adj").read_text())
    result = subprocess.run([sys.executable, "-c", CHILD, "512"], capture_output=True,
                            text=True, timeout=120, check=True)  # fmt: skip
    refused, score = result.stdout.split()
    assert refused == "refused"
    assert int(score) == min(1000, parent + 500)
    uncapped = subprocess.run([sys.executable, "-c", CHILD, "0"], capture_output=True,
                              text=True, timeout=120, check=True)  # fmt: skip
    assert "refused" not in uncapped.stdout  # no cap: the same allocation succeeds
