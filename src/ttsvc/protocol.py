"""Typed messages between the gateway and its worker processes.

A leaf module: plain frozen dataclasses, no IO. Messages travel over a ``multiprocessing`` pipe;
audio travels as ``bytes`` (PCM16 little-endian), which pickles as one raw copy, never as a
pickled array. Every stream ends in exactly one final message: ``StreamDone`` or ``StreamError``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ttsvc.errors import TTSError


@dataclass(frozen=True)
class EngineSpec:
    """Which engine files a worker loads: content hashes into the gateway's engine cache."""

    label: str
    """The engine version clients see (``X-Engine-Version``): the manifest version, plus a
    content hash when files were replaced in place."""
    voice: str
    version: int
    source: str
    """The version directory the files came from (for logs)."""
    files: dict[str, str]
    """File name → sha256 of the cached copy."""
    replaced: tuple[str, ...]
    """Files whose bytes differ from their manifest entry (replaced in place)."""
    manifest: str
    """The version's manifest JSON (metadata: contexts, sample rate, fingerprint)."""
    cache_dir: str


# --- gateway → worker ---


@dataclass(frozen=True)
class ScriptText:
    """A piece of a run's text and where it came from in the request (an SSML document).

    Why spans travel with the text: word timestamps and marks point into the string the client
    sent, and the markup around the spoken text is not in what the worker reads."""

    text: str
    """What to read (a ``sub``'s alias, a ``say-as``'s words, or the document's own text)."""
    source: tuple[int, int]
    """``[start, end)`` of the request text it stands for."""
    verbatim: bool = True
    """Each character ``i`` is the request's character ``source[0] + i`` (else every character
    stands for the whole span: a rewritten form)."""
    phonemes: str | None = None
    """The voice's own phoneme symbols to say instead of reading ``text`` (SSML's ``phoneme``,
    a lexicon's pronunciation): ``text`` is then only the word it names."""

    @property
    def size(self) -> int:
        """The characters this piece counts as against the length caps: its text, or, when it
        is said by phonemes, one per symbol (a word's symbols are about as many as its
        letters). Why: the symbols, not the word they name, are what the acoustic model reads,
        so 3,000 of them under one word must not pass as one character."""
        if self.phonemes is None:
            return len(self.text)
        return sum(1 for ch in self.phonemes if not ch.isspace())


@dataclass(frozen=True)
class ScriptRun:
    """Speech said with one rate and volume: one or more sentences, each one acoustic run."""

    pieces: tuple[ScriptText, ...]
    rate: float = 1.0
    """Multiplies the request's speed (SSML's ``prosody rate``)."""
    gain: float = 1.0
    """Linear gain on the samples (SSML's ``prosody volume``)."""
    marks: tuple[tuple[str, int], ...] = ()
    """SSML ``mark`` names and their offsets in the request text: each is timed at the first
    word that starts at or after it (or at the run's end)."""
    voice: str | None = None
    """Another served voice to say it in (SSML's ``voice``; ``None``: the request's), its audio
    resampled to the request voice's rate."""


@dataclass(frozen=True)
class ScriptBreak:
    """Silence between runs."""

    seconds: float | None
    """``None``: the request's sentence pause (the boundary of an SSML ``s`` or ``p``)."""


@dataclass(frozen=True)
class ScriptMark:
    """A mark after the last run: timed at the end of the audio."""

    name: str
    at: int


ScriptItem = ScriptRun | ScriptBreak | ScriptMark
Script = tuple[ScriptItem, ...]
"""What an SSML document (or a text a lexicon rewrote) asks the worker to say, in order."""


@dataclass(frozen=True)
class SynthesisJob:
    """Start one stream on a worker."""

    uid: str
    """Request id, also in the response header and every log line."""
    text: str
    speed: float
    noise_scale: float | None
    noise_w: float | None
    sentence_silence: float
    sample_rate: int | None = None
    """Output rate; ``None`` is the voice's own rate (no resampling)."""
    max_audio_s: float | None = None
    """Most audio the stream may produce (seconds); ``None``: no cap."""
    key: str | None = None
    """Name of the API key that asked (``None``: no keys): streams of different keys take
    turns on a worker."""
    voice: str = ""
    """The voice to speak with (``""``: the worker's first voice); a worker that does not hold
    it loads it first."""
    speaker: int | None = None
    """Speaker id of a multi-speaker voice (the gateway resolved a name); ``None``: its first."""
    timestamps: bool = False
    """Send each word's times with the chunk its audio starts in (``AudioChunkMsg.words``); an
    engine without phoneme durations fails the stream with ``timestamps_unavailable``."""
    script: Script | None = None
    """Say this instead of reading ``text`` (which is then only its spoken words, for estimates):
    the request was SSML, or a lexicon rewrote it. Made and checked in the gateway."""


@dataclass(frozen=True)
class CancelStream:
    """The client went away: stop computing ``uid`` at the next window boundary."""

    uid: str


@dataclass(frozen=True)
class SwapEngines:
    """Load ``spec`` beside the serving engines, run the canary, and if it passes, serve it.

    Streams already running finish on the engines they started with.
    """

    spec: EngineSpec
    seq: int
    """Request number: a worker applies only the newest of each voice; its answer carries the
    same number."""
    load: bool = True
    """Load and judge it even if the worker does not hold the voice (the staging worker). A
    worker asked with ``False`` that does not hold the voice only remembers the spec, for when
    a request needs it, and answers at once."""


@dataclass(frozen=True)
class Shutdown:
    """Finish nothing more; exit."""


# --- worker → gateway ---


@dataclass(frozen=True)
class WorkerReady:
    """Engines loaded and a warm-up synthesis passed: the worker may be routed to."""

    worker: int
    voice: str
    engine_version: str
    sample_rate: int
    capacity: float = 0.0
    """Audio seconds per second the process can compute with all its compute threads, as
    measured at start (0: unknown)."""
    threads: int = 1
    """Compute threads the process runs over its one deadline queue."""
    voices: tuple[str, ...] = ()
    """Voices the worker holds loaded (the balancer prefers a worker that holds a request's)."""


@dataclass(frozen=True)
class StartFailed:
    """The engines a worker was started on could not serve: they failed to load (a file no
    runtime parses, a build for another machine) or failed the canary. The worker exits after
    sending it; the gateway then judges the version, not the worker (it is rejected, and the
    voice's next older good version is what workers start on)."""

    worker: int
    voice: str
    label: str
    """The engine version that failed (``EngineSpec.label``)."""
    reason: str
    """Why, as clients may read it: a file name and a short reason, no host paths."""
    detail: str = ""
    """Why, for the log: paths and the runtime's own message."""


@dataclass(frozen=True)
class Heartbeat:
    """Sent on a fixed cadence whether or not the worker is busy."""

    worker: int
    qsize: int
    """Streams on this worker, running or waiting for their first window."""
    capacity: float = 0.0
    """Audio seconds per second the process can compute now, kept current from real step
    costs (0: unknown)."""
    demand: float = 0.0
    """Audio seconds per second the streams it computes need to keep playing (each admitted
    stream still computing needs one)."""
    waiting: int = 0
    """Streams held back because admitting them would push demand past capacity."""
    misses: int = 0
    """Chunks sent after their stream's playback deadline, since the worker started."""
    late_s: float = 0.0
    """Seconds those chunks were late, summed, since the worker started."""
    voices: tuple[str, ...] = ()
    """Voices the worker holds loaded now, least recently used first."""
    settled: bool = False
    """Idle, and has given back what its last work freed: its RSS now is its resting size."""


@dataclass(frozen=True)
class WordTime:
    """When one word of the request text is said in a stream's audio."""

    word: str
    """The word as spoken (normalized: "twelve" for a part of "$12.50")."""
    start: float
    """Seconds from the stream's start to the first frame of its first phoneme."""
    end: float
    """Seconds from the stream's start to the end of its last phoneme."""
    text_span: tuple[int, int]
    """``[start, end)`` character offsets in the request text it was read from: several words
    share one span where normalization made them of one written form ("$12.50")."""
    mark: bool = False
    """An SSML ``mark`` (``word`` is its name, ``start == end``), not a spoken word."""

    def to_json(self) -> dict[str, object]:
        """As clients receive it (times rounded to the microsecond)."""
        if self.mark:
            return {"mark": self.word, "time": round(self.start, 6),
                    "text_span": list(self.text_span)}  # fmt: skip
        return {"word": self.word, "start": round(self.start, 6), "end": round(self.end, 6),
                "text_span": list(self.text_span)}  # fmt: skip


def timed_json(words: tuple[WordTime, ...]) -> dict[str, list[dict[str, object]]]:
    """A chunk's words as clients receive them (``words``), its SSML marks apart (``marks``,
    only when there are some: a client that never sends SSML never sees the key)."""
    out: dict[str, list[dict[str, object]]] = {"words": [w.to_json() for w in words
                                                         if not w.mark]}  # fmt: skip
    marks = [w.to_json() for w in words if w.mark]
    if marks:
        out["marks"] = marks
    return out


@dataclass(frozen=True)
class AudioChunkMsg:
    """One window of a stream's audio."""

    uid: str
    pcm: bytes
    """PCM16 little-endian mono at the stream's output rate."""
    offset: int
    """Sample index (at the voice's own rate) of this chunk within the utterance."""
    engine_version: str
    compute_s: float
    """Compute time of this window (of the front end and sentence engine too, for a first one)."""
    queued_s: float = 0.0
    """On a stream's first chunk: how long the job waited in the worker before its first step."""
    offset_s: float = 0.0
    """``offset`` in seconds: how far into the utterance this chunk starts (a client that stops
    playing mid-chunk knows how far the listener got)."""
    words: tuple[WordTime, ...] = ()
    """The words whose start lies in this chunk, for a job that asked for ``timestamps``."""


@dataclass(frozen=True)
class StreamDone:
    """Final message of a stream that completed (or was cancelled)."""

    uid: str
    audio_samples: int
    compute_s: float


@dataclass(frozen=True)
class StreamError:
    """Final message of a stream that failed; ``status``/``type`` come from the error table."""

    uid: str
    status: int
    type: str
    message: str
    field: str | None = None

    @classmethod
    def of(cls, uid: str, error: TTSError) -> StreamError:
        """The stream ended by ``error``: its status and type from the error table, never
        chosen at the call site."""
        return cls(uid, error.status, error.type, error.message, error.field)


@dataclass(frozen=True)
class EnginesSwapped:
    """Answer to ``SwapEngines``: ``ok`` means the worker now serves ``label``."""

    worker: int
    """The answering worker, or -1 when the gateway made the answer up (timeout, exit)."""
    label: str
    ok: bool
    reason: str = ""
    """Why not, as clients may read it: a file name and a short reason, no host paths."""
    seq: int = 0
    detail: str = ""
    """Why not, for the log: paths and the runtime's own message."""
    precision: dict[str, str] = field(default_factory=dict)
    """Per engine, the precision the worker found in what it loaded (when ``ok``)."""


ToWorker = SynthesisJob | CancelStream | SwapEngines | Shutdown
FromWorker = (WorkerReady | StartFailed | Heartbeat | AudioChunkMsg | StreamDone | StreamError
              | EnginesSwapped)
