"""Every Prometheus metric ttsvc exports, recorded in the gateway from worker reports.

Workers never touch a metric: they report over their pipe and the gateway records, so there are
no multiprocess metric files and a respawned worker loses nothing. The registry is per gateway
(not prometheus_client's global one), so tests can run several gateways in one process, and it
is served on its own port (default 9091), never on the public API port.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (
    0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.045, 0.05, 0.06, 0.07, 0.08, 0.09,
    0.1, 0.125, 0.15, 0.175, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5,
    3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0,
)  # fmt: skip
"""5 ms to 30 s, dense below 100 ms where the TTFA SLO lives, so P99 interpolates meaningfully."""
RTF_BUCKETS = (0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0)


class ServiceMetrics:
    """The gateway's metrics; lives in the gateway process, touched from its event loop."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.ttfa = Histogram("ttsvc_ttfa_seconds", "Time from request to first audio byte",
                              buckets=LATENCY_BUCKETS, registry=r)  # fmt: skip
        self.latency = Histogram("ttsvc_request_latency_seconds", "Time from request to last byte",
                                 buckets=LATENCY_BUCKETS, registry=r)  # fmt: skip
        self.chunk_gap = Histogram("ttsvc_chunk_gap_seconds", "Time between audio chunks",
                                   buckets=LATENCY_BUCKETS, registry=r)  # fmt: skip
        self.queue_wait = Histogram("ttsvc_queue_wait_seconds",
                                    "Time a stream waited in its worker before its first step",
                                    buckets=LATENCY_BUCKETS, registry=r)  # fmt: skip
        self.rtf = Histogram("ttsvc_real_time_factor", "Worker compute seconds per audio second",
                             buckets=RTF_BUCKETS, registry=r)  # fmt: skip
        self.requests = Counter("ttsvc_requests", "Synthesis requests by HTTP code and outcome",
                                ["code", "outcome"], registry=r)  # fmt: skip
        self.rejections = Counter("ttsvc_rejections", "Requests refused before synthesis",
                                  ["reason"], registry=r)  # fmt: skip
        self.format_requests = Counter("ttsvc_format_requests",
                                       "Synthesis requests dispatched, by output format and API",
                                       ["format", "api"], registry=r)  # fmt: skip
        self.encode_seconds = Counter("ttsvc_encode_seconds",
                                      "Gateway time spent encoding audio, by output format",
                                      ["format"], registry=r)  # fmt: skip
        self.cancellations = Counter("ttsvc_cancellations",
                                     "Streams cancelled because the client went away",
                                     registry=r)  # fmt: skip
        self.connection_timeouts = Counter("ttsvc_connection_timeouts",
                                           "Connections closed for keeping the server waiting, "
                                           "by phase: idle, header or body",
                                           ["phase"], registry=r)  # fmt: skip
        self.aborted_streams = Counter("ttsvc_aborted_streams",
                                       "Streams cut off after their audio began, by reason; the "
                                       "response ends without its terminator, so clients see "
                                       "an error", ["reason"], registry=r)  # fmt: skip
        self.underruns = Counter("ttsvc_underruns",
                                 "Chunks that arrived after the audio before them would have "
                                 "finished playing in real time", registry=r)  # fmt: skip
        self.deadline_misses = Counter("ttsvc_deadline_misses",
                                       "Chunks a worker sent after their stream's playback "
                                       "deadline (server-side underruns)",
                                       registry=r)  # fmt: skip
        self.deadline_late_seconds = Counter("ttsvc_deadline_late_seconds",
                                             "Seconds those chunks were late, summed",
                                             registry=r)  # fmt: skip
        self.worker_restarts = Counter("ttsvc_worker_restarts", "Worker processes respawned",
                                       registry=r)  # fmt: skip
        self.engine_reloads = Counter("ttsvc_engine_reloads", "Engine swap candidates by result",
                                      ["result"], registry=r)  # fmt: skip
        self.audio_seconds = Counter("ttsvc_audio_seconds", "Seconds of audio streamed",
                                     registry=r)  # fmt: skip
        self.characters = Counter("ttsvc_characters", "Characters of text synthesized",
                                  registry=r)  # fmt: skip
        self.wyoming_connections = Gauge("ttsvc_wyoming_connections",
                                         "Wyoming connections open now", registry=r)  # fmt: skip
        self.wyoming_closed = Counter("ttsvc_wyoming_closed",
                                      "Wyoming connections the server refused or closed because "
                                      "of the client, by reason: idle, forbidden, overloaded "
                                      "(connection cap), invalid_json, payload_too_large, "
                                      "request_timeout", ["reason"], registry=r)  # fmt: skip
        self.websocket_sessions = Gauge("ttsvc_websocket_sessions",
                                        "WebSocket sessions of incremental text open now, every "
                                        "route's", registry=r)  # fmt: skip
        self.websocket_closed = Counter("ttsvc_websocket_closed",
                                        "WebSocket sessions the server refused or closed because "
                                        "of the client, by reason: idle, overloaded (session "
                                        "cap)", ["reason"], registry=r)  # fmt: skip
        self.streams_in_flight = Gauge("ttsvc_streams_in_flight", "Streams dispatched to a worker",
                                       ["worker"], registry=r)  # fmt: skip
        self.streams_queued = Gauge("ttsvc_streams_queued",
                                    "Streams dispatched that have no audio yet",
                                    ["worker"], registry=r)  # fmt: skip
        self.worker_score = Gauge("ttsvc_worker_heat_score", "Heat score of a worker (0-100)",
                                  ["worker"], registry=r)  # fmt: skip
        self.headroom = Gauge("ttsvc_headroom_ratio",
                              "Share of the live workers' real-time room still free, 0-1 "
                              "(/health's score): new streams are refused 429 no_headroom as "
                              "it reaches 0, so scale out well before", registry=r)  # fmt: skip
        self.worker_capacity = Gauge("ttsvc_worker_capacity_audio_seconds_per_second",
                                     "Audio seconds per second a worker can compute (0: unknown)",
                                     ["worker"], registry=r)  # fmt: skip
        self.worker_demand = Gauge("ttsvc_worker_demand_audio_seconds_per_second",
                                   "Audio seconds per second the streams a worker computes need",
                                   ["worker"], registry=r)  # fmt: skip
        self.admission_waiting = Gauge("ttsvc_worker_admission_waiting_streams",
                                       "Streams a worker holds back until it has the capacity",
                                       ["worker"], registry=r)  # fmt: skip
        self.engine_info = Gauge("ttsvc_engine_info", "The engine set serving (value 1)",
                                 ["voice", "version", "backend", "precision"],
                                 registry=r)  # fmt: skip
        self.engine_rejected = Gauge("ttsvc_engine_rejected",
                                     "Engine versions present that may not serve (value 1), by "
                                     "the file at fault", ["voice", "version", "file"],
                                     registry=r)  # fmt: skip
        self.worker_settled = Gauge("ttsvc_worker_memory_settled",
                                    "1 while a worker is idle and has given back what its last "
                                    "work freed (its RSS then is its resting size)", ["worker"],
                                    registry=r)  # fmt: skip
        self.voices_loaded = Gauge("ttsvc_worker_voice_loaded",
                                   "Voices a worker holds loaded now (value 1; the others are "
                                   "loaded when a request needs them)", ["worker", "voice"],
                                   registry=r)  # fmt: skip
        self._engine_labels: dict[str, tuple[str, str, str, str]] = {}
        self._rejected_labels: dict[str, list[tuple[str, str, str]]] = {}
        self._voice_labels: dict[str, set[str]] = {}

    def set_engine(self, voice: str, version: str, backend: str, precision: str) -> None:
        """Mark ``voice``'s serving engine set; its previous one's series is removed."""
        if (old := self._engine_labels.get(voice)) is not None:
            self.engine_info.remove(*old)
        self._engine_labels[voice] = (voice, version, backend, precision)
        self.engine_info.labels(voice, version, backend, precision).set(1)

    def set_rejected(self, voice: str, versions: list[tuple[str, str]]) -> None:
        """The versions of ``voice`` refused now, as (version, file); its others' series go,
        other voices' stay."""
        for labels in self._rejected_labels.pop(voice, []):
            self.engine_rejected.remove(*labels)
        self._rejected_labels[voice] = [(voice, version, file) for version, file in versions]
        for labels in self._rejected_labels[voice]:
            self.engine_rejected.labels(*labels).set(1)

    def set_voices(self, worker: int, voices: tuple[str, ...]) -> None:
        """The voices ``worker`` holds loaded now (none once it is gone)."""
        w = str(worker)
        before = self._voice_labels.get(w, set())
        for voice in before - set(voices):
            self.voices_loaded.remove(w, voice)
        for voice in voices:
            self.voices_loaded.labels(w, voice).set(1)
        self._voice_labels[w] = set(voices)

    def set_worker(self, worker: int, in_flight: int, queued: int, score: float | None) -> None:
        """Per-worker gauges, refreshed whenever the gateway's view of a worker changes."""
        w = str(worker)
        self.streams_in_flight.labels(w).set(in_flight)
        self.streams_queued.labels(w).set(queued)
        if score is not None:
            self.worker_score.labels(w).set(score)

    def watch_settled(self, worker: int, settled: Callable[[], bool]) -> None:
        """Read ``worker``'s settled flag at every scrape: it changes on messages the pool sends
        as well as on those it receives, and a value set on some of them would lag the others."""
        self.worker_settled.labels(str(worker)).set_function(lambda: float(settled()))

    def set_capacity(self, worker: int, capacity: float, demand: float, waiting: int) -> None:
        """A worker's real-time capacity, its streams' demand and the streams it holds back;
        all zero once the worker is gone, like its queue gauges."""
        w = str(worker)
        self.worker_capacity.labels(w).set(capacity)
        self.worker_demand.labels(w).set(demand)
        self.admission_waiting.labels(w).set(waiting)

    def count_deadlines(self, misses: int, late_s: float) -> None:
        """Add deadline misses and their seconds late, as increments since the last report."""
        if misses > 0:
            self.deadline_misses.inc(misses)
        if late_s > 0:
            self.deadline_late_seconds.inc(late_s)
