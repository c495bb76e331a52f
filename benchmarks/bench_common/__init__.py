"""The one shared home of the benchmark scripts' helpers.

Why this exists: the scripts must describe the machine, read the corpus, start ``ttsvc serve``
(or a server to compare it with), send and time synthesis requests, compute percentiles and
write their tables and JSON in exactly the same way, or their results stop being comparable
with each other. Keeping one copy here means a fix (a readiness race, a NaN that breaks strict
JSON, an underrun miscounted) lands in every benchmark at once.

* ``context``: paths, the corpus, the machine description, the run's date;
* ``stats``: the one percentile function (linear or nearest-rank) and ratios;
* ``report``: table cells, the markdown table writer, strict JSON, atomic writes, raw records;
* ``server``: a server subprocess on loopback (``ttsvc serve`` or any other command);
* ``client``: reading a streamed WAV answer, one HTTP synthesis request as a real-time
  player hears it;
* ``load``: closed, paced and open load loops, level statistics, the server's CPU and memory.

The scripts run as ``python benchmarks/<name>.py``, so ``benchmarks/`` is ``sys.path[0]`` and
they import this package as ``bench_common``. The names most scripts use are re-exported here;
``load`` is imported as ``bench_common.load``. It is not a test helper and not part of ``ttsvc``.
"""

from __future__ import annotations

from bench_common.client import (
    WAV_HEADER_BYTES,
    Playback,
    Record,
    Stream,
    one_request,
    playback,
    playback_end_s,
    read_wav,
)
from bench_common.context import (
    DEFAULT_CORPUS,
    DEFAULT_ENGINES,
    HERE,
    MAX_CHARS,
    MIN_CHARS,
    RESULTS,
    ROOT,
    SERVER_LOG_DIR,
    cpu_model,
    load_corpus,
    machine_info,
    relative,
    utc_timestamp,
)
from bench_common.report import (
    chosen_sections,
    clean,
    fmt,
    markdown_table,
    raw_path,
    run_sections,
    sections_parser,
    write_atomic,
    write_json,
    write_raw,
)
from bench_common.server import (
    HOST,
    STOP_TIMEOUT_S,
    Server,
    ServerProcess,
    free_port,
    log_tail,
    serve_argv,
)
from bench_common.stats import finite, pct, ratio

__all__ = [
    "DEFAULT_CORPUS",
    "DEFAULT_ENGINES",
    "HERE",
    "HOST",
    "MAX_CHARS",
    "MIN_CHARS",
    "RESULTS",
    "ROOT",
    "SERVER_LOG_DIR",
    "STOP_TIMEOUT_S",
    "WAV_HEADER_BYTES",
    "Playback",
    "Record",
    "Server",
    "ServerProcess",
    "Stream",
    "chosen_sections",
    "clean",
    "cpu_model",
    "finite",
    "fmt",
    "free_port",
    "load_corpus",
    "log_tail",
    "machine_info",
    "markdown_table",
    "one_request",
    "pct",
    "playback",
    "playback_end_s",
    "ratio",
    "raw_path",
    "read_wav",
    "relative",
    "run_sections",
    "sections_parser",
    "serve_argv",
    "utc_timestamp",
    "write_atomic",
    "write_json",
    "write_raw",
]
