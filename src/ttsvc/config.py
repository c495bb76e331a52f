"""Settings: one pydantic-settings class, built once by the CLI and passed down, never global.

Every field is also a ``TTSVC_*`` environment variable (e.g. ``TTSVC_ENGINES_DIR``); command-line
flags override the environment. Validators refuse values that would make the service unsafe or
useless instead of letting them fail later inside a worker.
"""

from __future__ import annotations

import contextlib
import re
from ipaddress import ip_network
from pathlib import Path
from typing import Any, Literal

from platformdirs import user_cache_path
from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from ttsvc.balancer import BalancerSettings
from ttsvc.balancer.model import Overload
from ttsvc.cpus import (
    MAX_PROCESSES,
    MAX_THREADS,
    CpuBudget,
    complete_split,
    cpu_budget,
)
from ttsvc.memory import WORKER_MIN_MB, cgroup_memory_limit, worker_memory_mb
from ttsvc.windows import WindowSchedule

DEFAULT_VOICE = "en_US-joe-medium"
LogFormat = Literal["auto", "json", "console"]
STREAMS_PER_THREAD = 20
"""Default stream slots per compute thread: about twice the real-time streams one core here
computes, so a burst waits in a worker's queue for capacity instead of getting 429."""


def default_engines_dir() -> Path:
    """``engines`` under the user's cache directory (``$XDG_CACHE_HOME/ttsvc`` or
    ``~/.cache/ttsvc`` on Linux, the platform's own elsewhere): compiled engines are derived
    data that can be rebuilt, and a fixed place keeps one compile for every directory."""
    return user_cache_path("ttsvc", appauthor=False) / "engines"


class Settings(BaseSettings):
    """Runtime settings shared by ``ttsvc synth`` and ``ttsvc serve``."""

    model_config = SettingsConfigDict(env_prefix="TTSVC_", extra="ignore")

    engines_dir: Path = Field(default_factory=default_engines_dir)
    """Root of the engine repository (a HostPath in Kubernetes; the image and the chart set it).
    Default: the user's cache directory (``default_engines_dir``), the same from any working
    directory, so ``ttsvc synth`` run elsewhere finds the engines ``ttsvc serve`` compiled."""
    voice: str = DEFAULT_VOICE
    """Voice used when a request names none."""
    threads: int = Field(1, ge=1, le=64)
    """ONNX Runtime intra-op threads per engine run."""
    cpus: int | None = Field(None, ge=1, le=4096)
    """CPUs the pool plans ``workers`` x ``compute_threads`` for (default: the container's cgroup
    CPU quota rounded up, bounded by the affinity mask, never the node's core count; the Helm
    chart passes the pod's CPU request, since a pod without a CPU limit has no quota)."""
    compute_threads: int = Field(ge=1, le=MAX_THREADS)
    """Compute threads per worker process, all over one deadline queue. Unset: from ``cpus``
    (``ttsvc.cpus.default_split``: one process up to 4 CPUs, then ``ceil(cpus / 4)``
    processes), or ``ceil(cpus / workers)`` when ``workers`` is given. Resolved to a number
    before validation, so it is always an int once built."""
    realtime_load: float = Field(0.75, gt=0.0, le=4.0)
    """Share of a process's measured real-time capacity its admitted streams may demand; a new
    stream past it waits for a running one to finish (its time to first audio grows) instead
    of making running streams stall."""
    overload: Overload = "refuse"
    """When every worker's real-time capacity is taken: ``refuse`` answers a new stream 429
    ``no_headroom`` with a ``Retry-After`` at once, before any worker sees it (running streams
    keep playing, a client can try another pod); ``queue`` sends it to the least loaded worker,
    which holds it until it has room, up to ``queue_timeout_s`` (its first audio waits)."""
    step_floor_ms: float = Field(50.0, ge=5.0, le=1000.0)
    """The shortest bound the deadline scheduler puts on a step (a flow chunk or vocoder window)
    while other streams wait for a thread: larger steps overlap less, so a saturated worker
    computes more audio per second, and a stream that needs a thread waits up to this long."""
    whole_sentences: bool = True
    """Run a sentence whole, on the plain graphs a stateful engine version carries, where its
    listener can wait for it: a first sentence while other streams wait for admission, a later
    one while the sentence before still plays. About three quarters of the engine time of
    streamed windows, so a saturated worker computes more audio per second; off (``false``),
    every sentence streams in windows and a queued stream's first audio comes sooner."""
    first_window_frames: int = Field(16, ge=1, le=256)
    """Frames in a sentence's first vocoder window: smaller starts audio sooner."""
    alone_first_window_frames: int = Field(4, ge=0, le=256)
    """Frames in the first window of a stream that starts while its worker has no other
    stream (0: always ``first_window_frames``): audio starts sooner when nothing else plays."""
    window_growth: float = Field(8.0, ge=1.0, le=64.0)
    """Growth factor of later windows."""
    max_window_frames: int = Field(512, ge=1, le=4096)
    """Largest vocoder window in frames."""
    max_sentence_chars: int = Field(200, ge=20, le=2000)
    """Sentences longer than this are split at clauses for streaming."""
    max_text_chars: int = Field(4096, ge=1, le=100_000)
    """Longest text accepted per request."""
    lexicons_dir: Path | None = None
    """Where the pronunciation lexicons (PLS files) are read from; unset: ``lexicons/`` in the
    engines directory. The chart sets it to its ConfigMap's mount, apart from the (read-only)
    engines mount."""
    ssml_unknown_elements: Literal["reject", "ignore"] = "reject"
    """An SSML element ttsvc does not speak: ``reject`` answers 422 naming it and its line;
    ``ignore`` speaks its text as if it were not there."""
    openai_ssml: bool = True
    """Read OpenAI's ``input`` as SSML when it starts with ``<speak`` (off: read as text)."""
    max_audio_s: float = Field(600.0, gt=0, le=86_400)
    """Most audio one request may produce, in seconds at its speed: a text estimated to exceed
    it is refused with 422 before any audio, and a stream that would pass it is stopped."""
    host: str = "127.0.0.1"
    """Address ``ttsvc serve`` and its metrics listen on: loopback unless asked, so a bare
    ``ttsvc serve`` on a workstation is not reachable from the network; the image and the chart
    set ``0.0.0.0`` (a container is reached through its own network namespace)."""
    port: int = Field(9000, ge=1, le=65535)
    metrics_port: int = Field(9091, ge=0, le=65535)
    """Prometheus ``/metrics`` port, apart from the API so it need not be public; 0 turns it off."""
    wyoming_port: int = Field(0, ge=0, le=65535)
    """Port of the Wyoming protocol (Home Assistant's voice pipeline) on ``host``; 0, the
    default, turns it off. The protocol has no authentication: with API keys on, its requests
    are charged to a key named ``wyoming`` with the default quota."""
    wyoming_host: str | None = None
    """Address the Wyoming port listens on (unset: ``host``): the protocol has no credentials,
    so it may be kept on a private interface while the HTTP API is public."""
    wyoming_allow: list[str] = Field(default_factory=list)
    """Client addresses or networks (``192.168.1.0/24``, ``10.0.0.7``; in the environment a
    JSON list) that may connect to the Wyoming port; empty: any. A client outside them gets an
    ``error`` event and is disconnected."""
    wyoming_ssml: bool = False
    """Read Wyoming text that starts like an SSML document (``<speak>``) as SSML (``break``,
    ``say-as``, ``prosody``, ...), a one-shot ``synthesize``'s or a whole text stream's (held
    and spoken at its end). Off, the default: the protocol defines plain text, and an LLM's
    reply is read as written."""
    wyoming_max_connections: int = Field(64, ge=1, le=100_000)
    """Wyoming connections open at once; one more gets an ``error`` event and is closed."""
    wyoming_idle_timeout_s: float = Field(30.0, gt=0, le=3600)
    """A Wyoming connection that sends nothing for this long while nothing is being spoken on it
    is closed (a client streaming text pauses between pieces as its LLM writes, so longer than
    the HTTP idle timeout). An event cut short must arrive whole within ``header_timeout_s``
    and ``body_timeout_s``, as an HTTP request."""
    ws_max_sessions: int = Field(256, ge=1, le=100_000)
    """WebSocket sessions open at once, ``/synthesize/stream`` and ElevenLabs' routes counted
    together (each holds a socket and its tasks in the gateway whatever it sends); one more is
    refused at the handshake with 429 ``overloaded``. Below the usual 1024 descriptors a
    process may open, with room for HTTP's connections and the workers' pipes."""
    ws_idle_timeout_s: float = Field(60.0, gt=0, le=3600)
    """A WebSocket session whose client sends nothing for this long while nothing is being
    spoken or waited for on it is closed (1008). A voice agent keeps its socket between turns,
    so longer than Wyoming's; ElevenLabs closes after 20 s, so clients written for it send
    keep-alives or reconnect."""
    workers: int = Field(ge=1, le=MAX_PROCESSES)
    """Worker processes. Unset: from ``cpus`` like ``compute_threads``, or
    ``ceil(cpus / compute_threads)`` when that is given."""
    max_streams_per_worker: int = Field(ge=1, le=1024)
    """Streams a worker process may hold, computing or waiting for real-time capacity; beyond,
    429 with Retry-After. Unset: ``STREAMS_PER_THREAD`` per compute thread."""
    voice_wait_s: float = Field(10.0, ge=0, le=600)
    """A request for a voice still being verified (a version just published or pulled, or a
    voice found at start-up after the default one: its files hashed and copied, its canary run
    on one worker, a few seconds) waits up to this long for it to serve instead of being
    refused; past it, or with 0, 503 ``engine_unavailable``. A voice that serves answers at
    once, and one with no version left to judge is refused at once."""
    queue_timeout_s: float = Field(10.0, gt=0, le=600)
    """A request that gets no first audio within this is failed (503) and cancelled."""
    max_body_bytes: int = Field(65536, ge=1024, le=16 * 1024 * 1024)
    """Request bodies over this get 413."""
    drain_grace_s: float = Field(30.0, ge=0, le=3600)
    """On SIGTERM, how long in-flight streams get to finish."""
    idle_timeout_s: float = Field(5.0, gt=0, le=3600)
    """A connection with no request under way (new, or kept alive after a response) is closed
    after this long without a byte (uvicorn's keep-alive, also bounding new connections)."""
    header_timeout_s: float = Field(10.0, gt=0, le=3600)
    """From its first byte, a request's line and headers must arrive within this, or the
    connection is closed (slow-loris)."""
    body_timeout_s: float = Field(10.0, gt=0, le=3600)
    """A request body must arrive whole within this after its headers, or the request gets 408
    and the connection is closed (a body trickled a byte at a time)."""
    worker_start_timeout_s: float = Field(120.0, gt=0, le=3600)
    """A worker that is not READY this long after its start is killed and respawned."""
    worker_silence_timeout_s: float = Field(10.0, gt=0, le=3600)
    """A READY worker silent this long (no heartbeat, e.g. hung in native code) is killed."""
    balancer_refresh_s: float = Field(0.2, gt=0, le=60)
    """How often heat scores fold in new latency observations."""
    balancer_heartbeat_timeout_s: float = Field(5.0, gt=0, le=600)
    """Workers with an older heartbeat are not routed to (circuit breaker when none is left)."""
    balancer_slow_ms: float = Field(1000.0, gt=0)
    """A normalized latency above this is a strike; ``balancer_slow_strikes`` in a row halve the
    worker's score ("cold standby")."""
    balancer_slow_strikes: int = Field(3, ge=1, le=100)
    balancer_decay: float = Field(0.9, gt=0, lt=1)
    """Weight of the old score in ``score = min(100, decay * score + bonus)``."""
    balancer_reference_ttfa_ms: float = Field(50.0, gt=0)
    """Worker-side time to first audio that scores like the seed's 50 ms latency; makes scores
    comparable across machines (CPU vs GPU) and text lengths."""
    watch_polling: bool = False
    """Poll the engines directory instead of using inotify (for filesystems without events)."""
    watch_settle_s: float = Field(5.0, gt=0, le=60)
    """A file that differs from its manifest is judged once its size, mtime and inode have stayed
    unchanged this long (one that matches is judged at once). Longer than the pauses of a
    throttled copy (``rsync --bwlimit``, ``pv -L``, a slow network mount writing back in bursts
    a second or more apart), so a half-copied file is never parsed or reported; the cost is only
    this much delay for an in-place replacement that does not match its manifest."""
    swap_timeout_s: float = Field(120.0, gt=0, le=3600)
    """How long one worker may take to load and canary a candidate."""
    engine_cache_dir: Path | None = None
    """Writable scratch for verified engine copies (default: a new directory under /tmp)."""
    engine_trust_checks: bool = True
    """Refuse an engine version whose files or directories anyone may write, someone other than
    root, this service's user or the engines directory's owner owns, or that lead outside the
    engines directory (``ttsvc.repository.trust``); off only for filesystems that show every
    file as anyone's (some CIFS mounts)."""
    compile_default_voice: bool = True
    """Compile the packaged default voice when the engines directory has none."""
    log_level: str = "info"
    log_format: LogFormat = "auto"
    """``auto``: human-readable lines when the log stream is a terminal, JSON lines otherwise
    (a container, a pipe, a file: what Loki ingests); ``json`` or ``console`` force one."""
    api_keys_file: Path | None = None
    """Key file (``name sha256 [rpm=N] [audio_s_per_min=X]`` lines, e.g. a mounted Kubernetes
    Secret): when set, every route but ``/health`` and ``/live`` needs ``Authorization: Bearer``.
    Reloaded when it changes."""
    default_rpm: int | None = Field(None, ge=1, le=1_000_000)
    """Requests per minute for keys whose line sets none (unset: unlimited)."""
    default_audio_s_per_min: float | None = Field(None, gt=0, le=1_000_000)
    """Audio seconds per minute for keys whose line sets none (unset: unlimited)."""
    default_key_streams: int | None = Field(None, ge=1, le=1_000_000)
    """Concurrent streams for keys whose line sets none (unset: a fair share of the slots, see
    ``KeyRateLimiter.fair_share``)."""
    api_docs: bool = False
    """Serve ``/docs``, ``/redoc`` and ``/openapi.json``; with API keys on they need a key like
    every other route. Off by default: the Swagger and ReDoc pages load their scripts from a
    public CDN, which a service should not make its users' browsers fetch unasked."""
    cors_origins: list[str] = Field(default_factory=list)
    """Browser origins allowed to call the API (``https://app.example.com``, or ``*``; in the
    environment a JSON list); empty: no CORS headers at all, so browsers on other origins are
    refused."""
    voice_aliases: dict[str, str] = Field(default_factory=dict)
    """Voice names mapped to served voices (JSON), over the default mapping of OpenAI's voice
    names (alloy, echo, ...) to ``voice``."""
    voice_memory_mb: float = Field(1024.0, ge=0.0, le=1_000_000.0)
    """Megabytes the voices one worker holds loaded may take (every voice under
    ``engines_dir`` is served; a worker loads a voice when a request first needs it), each
    counted as its engine files times the resident bytes per file byte the worker measured
    loading its first voice (about 140 MB for a medium Piper voice). Past it, the worker lets go
    of the voice it used least recently; 0: no limit."""

    worker_memory_mb: float = Field(ge=0.0, le=1_000_000.0)
    """Most memory one worker process may take, as its data-size limit (``RLIMIT_DATA``: heap
    and private mappings, which run ahead of resident memory: about 1.5 times it under load);
    past it an allocation fails and the worker fails its request or dies and is respawned,
    instead of the pod being OOM-killed with the gateway. Workers also rank above the gateway
    for the OOM killer. Unset: ``voice_memory_mb`` + 1024, and inside a container memory limit
    no more than the limit less 256 MB split over the workers (``ttsvc.memory``); 0: no cap.
    Below 512 a medium voice does not load."""

    @model_validator(mode="before")
    @classmethod
    def _split_cpus(cls, data: Any) -> Any:
        """Fill in ``workers`` and ``compute_threads`` where unset (absent or None), so both are
        ints after validation, and ``max_streams_per_worker`` from the compute threads; given
        values, from flags or the environment, are kept as given.
        Runs at construction, never at import: it reads the cgroup files."""
        if not isinstance(data, dict):
            return data
        filled = dict(data)
        workers, threads = _given(data.get("workers")), _given(data.get("compute_threads"))
        if workers is None or threads is None:
            cpus = _given(data.get("cpus")) or cpu_budget().cpus
            split = complete_split(cpus, workers, threads)
            # a given but invalid value stays, for its field's validation error
            if data.get("workers") is None:
                filled["workers"] = split[0]
            if data.get("compute_threads") is None:
                filled["compute_threads"] = threads = split[1]
        if data.get("max_streams_per_worker") is None:
            filled["max_streams_per_worker"] = STREAMS_PER_THREAD * (threads or 1)
        if data.get("worker_memory_mb") is None:
            budget = float(cls.model_fields["voice_memory_mb"].default)
            with contextlib.suppress(TypeError, ValueError):  # invalid: its field says so
                budget = float(data.get("voice_memory_mb", budget))
            processes = _given(filled.get("workers")) or 1
            filled["worker_memory_mb"] = worker_memory_mb(budget, processes,
                                                          cgroup_memory_limit())  # fmt: skip
        return filled

    @field_validator("engines_dir")
    @classmethod
    def _engines_dir_is_a_directory(cls, value: Path) -> Path:
        # a file there (a mistyped path, a manifest named by mistake) is said now, in one line,
        # rather than as a traceback from the first compile or watch that meets it
        if value.exists() and not value.is_dir():
            raise ValueError(f"{value} is a file, not a directory (the engines directory holds "
                             "a directory per voice)")  # fmt: skip
        return value

    @field_validator("api_keys_file", mode="before")
    @classmethod
    def _no_key_file(cls, value: object) -> object:
        # an empty TTSVC_API_KEYS_FILE (a chart leaving keys off) means no file, not "."
        return None if value == "" else value

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, value: list[str]) -> list[str]:
        for origin in value:
            # an origin is scheme://host[:port], nothing after: a path would never match
            if origin != "*" and not re.fullmatch(r"https?://[^/\s]+", origin):
                raise ValueError(f"cors origin {origin!r}: expected scheme://host[:port] or *")
        return value

    @field_validator("wyoming_allow")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for net in value:
            try:
                ip_network(net, strict=False)
            except ValueError:
                raise ValueError(f"wyoming_allow {net!r}: expected an address or a network "
                                 "such as 192.168.1.0/24") from None  # fmt: skip
        return value

    @field_validator("voice_aliases")
    @classmethod
    def _aliases(cls, value: dict[str, str]) -> dict[str, str]:
        for alias, target in value.items():
            if not alias.strip() or not target.strip():
                raise ValueError("voice_aliases: names and voices must not be empty")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if self.max_window_frames < self.first_window_frames:
            raise ValueError("max_window_frames must be at least first_window_frames")
        if self.metrics_port and self.metrics_port == self.port:
            raise ValueError("metrics_port must differ from port: /metrics is not public")
        if self.wyoming_port and self.wyoming_port in (self.port, self.metrics_port):
            raise ValueError("wyoming_port must differ from port and metrics_port")
        if 0 < self.worker_memory_mb < WORKER_MIN_MB:
            raise ValueError(f"worker_memory_mb must be 0 (no cap) or at least {WORKER_MIN_MB:g}:"
                             " a worker needs that much to load a medium voice")
        if self.worker_silence_timeout_s <= self.balancer_heartbeat_timeout_s:
            # otherwise a hung worker is killed before it is even taken out of routing
            raise ValueError("worker_silence_timeout_s must exceed balancer_heartbeat_timeout_s")
        return self

    def cpu_budget(self) -> CpuBudget:
        """The CPUs the split was planned for and where the number came from (for the logs)."""
        return CpuBudget(self.cpus, "cpus setting") if self.cpus is not None else cpu_budget()

    def balancer_settings(self) -> BalancerSettings:
        """The heat-score balancer's constants from these settings."""
        return BalancerSettings(
            refresh_interval=self.balancer_refresh_s,
            heartbeat_timeout=self.balancer_heartbeat_timeout_s,
            slow_latency_ms=self.balancer_slow_ms,
            slow_strikes=self.balancer_slow_strikes,
            decay=self.balancer_decay,
            reference_ttfa_ms=self.balancer_reference_ttfa_ms,
            realtime_load=self.realtime_load,
            overload=self.overload,
        )

    def schedule(self) -> WindowSchedule:
        """The vocoder window schedule these settings describe."""
        return WindowSchedule(
            self.first_window_frames,
            self.window_growth,
            self.max_window_frames,
            alone_first=self.alone_first_window_frames,
        )


def _given(value: object) -> int | None:
    """A raw ``workers`` / ``compute_threads`` / ``cpus`` input as a usable count, else None."""
    if value is None or isinstance(value, bool):
        return None
    try:
        count = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None
    return count if count >= 1 else None
