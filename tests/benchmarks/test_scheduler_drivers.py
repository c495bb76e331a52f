"""The benchmarks that drive the worker's scheduler in process (``step_bench``'s Python per step,
``gpu_check``'s streams) still run it: ``--help`` alone would not show that a driver lost track
of the scheduler or of the engine calls it times. A tiny run of each on the CPU's engines."""

from __future__ import annotations

from gpu_check import run_streams
from step_bench import bench_scheduler
from ttsvc.backends.loader import load_engine_set
from ttsvc.repository.layout import EngineVersion
from ttsvc.synthesis import Synthesizer
from ttsvc.worker.costs import measure

TEXTS = ["Your order has shipped.", "Reply STOP to stop.", "The meeting starts at nine."]


def test_step_bench_times_the_deadline_schedulers_steps(default_version: EngineVersion) -> None:
    result = bench_scheduler(default_version.path, TEXTS, streams=2, rounds=1)
    assert result["scheduler"] == "DeadlineScheduler" and result["steps"] > 0
    # the engine timer sees the calls the steps make (each makes one or more), so what it
    # subtracts from a step is the engine runs and the Python left is the overhead
    assert result["engine_calls"] >= result["steps"]


def test_gpu_check_runs_its_streams_on_one_scheduler(default_version: EngineVersion) -> None:
    synth = Synthesizer(load_engine_set(default_version.path, 1))
    synth.calibrate()
    row = run_streams(synth, TEXTS, 3, measure(synth))
    assert row["failed"] == 0 and row["audio_s"] > 0
    assert row["ttfa_ms_max"] is not None and row["ttfa_ms_max"] > 0
    assert row["mean_batch"] == 1.0  # the CPU's engines do not batch
