"""The gateway process loads no part of the worker stack.

The gateway and the pool only route requests and spawn workers; ONNX Runtime, the synthesizer,
the text front end's phonemizer and the schedulers belong to the worker processes (their memory,
their start-up time). Checked in a fresh interpreter: this test process has them all loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

WORKER_STACK = (
    "onnxruntime", "onnx", "tensorrt", "ttsvc.synthesis", "ttsvc.backends.onnxruntime",
    "ttsvc.backends.loader", "ttsvc.backends.tensorrt", "ttsvc.backends.trt_engine",
    "ttsvc.backends.gpu", "ttsvc.compile", "ttsvc.text.frontend", "ttsvc.text.phonemize",
    "ttsvc.worker.process", "ttsvc.worker.deadline", "ttsvc.worker.costs", "ttsvc.worker.loading",
    "ttsvc.worker.deadline_policy",
    "ttsvc.worker.batching", "ttsvc.worker.voices", "ttsvc.worker.heap", "ttsvc.worker.streams",
)  # fmt: skip

PROBE = """
import importlib, json, pkgutil, sys
from pathlib import Path
import ttsvc.gateway, ttsvc.lifecycle, ttsvc.pool
from ttsvc.config import Settings
from ttsvc.gateway.app import create_app
create_app(Settings(engines_dir=Path(sys.argv[1])), "en_US-joe-medium")
for package in (ttsvc.gateway, ttsvc.lifecycle, ttsvc.pool):  # all, not only the app's
    for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        importlib.import_module(module.name)
print(json.dumps(sorted(sys.modules)))
"""


def test_building_the_gateway_imports_nothing_of_the_worker_stack(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path)], check=True,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    loaded = json.loads(out.stdout)
    assert "ttsvc.gateway.app" in loaded and "ttsvc.worker.entry" in loaded  # the probe ran
    assert "ttsvc.gateway.wyoming.server" in loaded and "ttsvc.pool.rollout" in loaded
    heavy = [m for m in loaded if any(m == p or m.startswith(p + ".") for p in WORKER_STACK)]
    assert heavy == []
