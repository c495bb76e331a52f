"""Output formats: streaming encoders over libsndfile (through ``soundfile``), one per response.

Every codec here is libsndfile's (LAME for MP3, libopus in Ogg, libFLAC, G.711 µ-law); nothing is
hand-written. An encoder takes PCM16 chunks as the worker sends them and returns the encoded
bytes libsndfile produced so far, so a response can go out piece by piece:

* **streamed**: libsndfile writes into a sink that hands new bytes on at once and drops its
  late rewrites of the header (MP3's Info frame, sizes). The bytes already sent keep their
  placeholders, which the formats define as "unknown"/"stream", so any prefix a client received
  is a valid stream: Ogg pages and MP3 frames each stand alone, and readers take WAV's largest
  sizes as "to the end". MP3 is constant bit rate, so players that estimate length from the
  byte count are right, and Ogg pages are cut every 50 ms of audio, not every second
  (libsndfile's default page latency would hold the first audio back for a second).
* **whole** (``stream: false``): libsndfile writes into a seekable buffer, so the file gets its
  exact sizes, FLAC sample count and MP3 Info tag (encoder delay, for gapless decoders).

FLAC is only ever whole (``OutputFormat.streams``): a FLAC stream's STREAMINFO must carry its
sample count, and with the "unknown" count of a stream libsndfile reports an endless file, so
``soundfile.read`` of a whole response fails. FLAC is an archival format, not a playback one:
clients that play as audio arrives have WAV, PCM, µ-law, MP3 and Opus.

Encoders are used from a worker thread of the gateway (encoding is CPU work and must stay off
the event loop); one stream's calls never overlap, and a lock makes a late ``close`` safe.
"""

from __future__ import annotations

import io
import threading
import time
from dataclasses import dataclass

import numpy as np
import soundfile as sf

from ttsvc.audio.resample import SUPPORTED_RATES
from ttsvc.audio.wav import streaming_header, wav_bytes

OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
"""The only input rates libopus accepts."""
MULAW_RATE = 8000
"""G.711 telephony: µ-law is 8 kHz audio by definition (``audio/basic``)."""

_OGG_PAGE_LATENCY_MS = 0x1302
"""libsndfile's ``SFC_SET_OGG_PAGE_LATENCY_MS`` (sndfile.h since 1.1.0; soundfile has no name
for it)."""
OGG_PAGE_MS = 50.0
"""Ogg page length in audio ms: libsndfile's least; a page costs ~30 bytes of header."""


@dataclass(frozen=True)
class OutputFormat:
    """A response format: how it is encoded, at which rates, and its media type."""

    name: str
    container: str
    """libsndfile major format, or ``""`` for the formats written here without libsndfile."""
    subtype: str
    rates: tuple[int, ...]
    """Output rates this format may be asked for."""
    default_rate: int | None
    """Rate when a request names none; ``None`` keeps the voice's own rate."""
    compression: float | None = None
    """libsndfile compression level (0-1): MP3 0.5 is ~80 kbit/s at 16-24 kHz and 160 at
    44.1-48 kHz (CBR); FLAC 0.5 is libFLAC level 4 (4096-sample blocks: FLAC is sent whole, so
    no frame needs flushing early), smaller than the lower levels at no more CPU; Opus 0.8 is
    ~61 kbit/s, where libopus codes speech in its CELT mode at 14 ms of CPU per audio second,
    against 35 ms in the hybrid mode of libsndfile's default ~40 kbit/s (measured:
    benchmarks/encode_bench.py)."""
    streams: bool = True
    """Whether a response may be sent as it is encoded; ``False``: only as a whole file, whose
    header holds what only the end knows and readers need (FLAC's sample count)."""

    def media_type(self, rate: int) -> str:
        """The Content-Type of a response in this format."""
        return {
            "wav": "audio/wav",
            "pcm": f"audio/L16;rate={rate};channels=1",
            "mulaw": "audio/basic",
            "mp3": "audio/mpeg",
            "opus": "audio/ogg;codecs=opus",
            "flac": "audio/flac",
        }[self.name]

    def rate_error(self, rate: int) -> str | None:
        """Why this format cannot be encoded at ``rate``, or ``None`` when it can."""
        if rate in self.rates:
            return None
        allowed = ", ".join(str(r) for r in self.rates)
        why = _RATE_RULES.get(self.name, "unsupported rate")
        return f"sample_rate {rate}: {why}; {self.name} accepts {allowed}"


_RATE_RULES = {
    "mulaw": "µ-law is 8 kHz telephony audio",
    "opus": "Opus has no mode at this rate (it defines 8, 12, 16, 24 and 48 kHz)",
}
_LIBRARY_RATES = tuple(SUPPORTED_RATES)
_OPUS_LIBRARY_RATES = tuple(r for r in _LIBRARY_RATES if r in OPUS_RATES)
FORMATS: dict[str, OutputFormat] = {
    f.name: f
    for f in (
        OutputFormat("wav", "", "", _LIBRARY_RATES, None),
        OutputFormat("pcm", "", "", _LIBRARY_RATES, None),
        OutputFormat("mulaw", "RAW", "ULAW", (MULAW_RATE,), MULAW_RATE),
        OutputFormat("mp3", "MP3", "MPEG_LAYER_III", _LIBRARY_RATES, None, 0.5),
        OutputFormat("opus", "OGG", "OPUS", _OPUS_LIBRARY_RATES, 24000, 0.8),
        OutputFormat("flac", "FLAC", "PCM_16", _LIBRARY_RATES, None, 0.5, streams=False),
    )
}
"""Every format a response can have; the voice's 22050 Hz is no Opus rate, so Opus defaults to
24000 Hz (the nearest above: nothing is lost)."""


class StreamSink:
    """The file libsndfile writes a streamed response into: new bytes are taken out as they
    come; a write over bytes already taken (a header fix-up on close) is dropped."""

    def __init__(self) -> None:
        self._pos = 0
        self._size = 0
        self._pending = bytearray()

    def write(self, data: bytes) -> int:
        end = self._pos + len(data)
        if end > self._size:  # only what extends the stream is new; rewrites are dropped
            self._pending += data[max(0, self._size - self._pos) :]
            self._size = end
        self._pos = end
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, size: int = -1) -> bytes:
        return b""  # libsndfile may probe a file opened for writing; there is nothing to read

    def take(self) -> bytes:
        """The bytes written since the last call."""
        out = bytes(self._pending)
        self._pending.clear()
        return out


class Encoder:
    """Encodes one response; ``encode`` per PCM16 chunk, then ``finish`` once.

    Streamed, each call returns the bytes to send now (possibly none: a codec may hold samples
    until it has a frame's worth). Whole, calls return nothing and ``finish`` returns the file.
    """

    def __init__(self, fmt: OutputFormat, rate: int, *, streamed: bool) -> None:
        if (why := fmt.rate_error(rate)) is not None:
            raise ValueError(why)
        if streamed and not fmt.streams:
            raise ValueError(f"{fmt.name} is encoded only as a whole file")
        self.format = fmt
        self.rate = rate
        self.streamed = streamed
        self.seconds = 0.0
        """Time spent encoding so far (for the per-format cost metric)."""
        self._lock = threading.Lock()
        self._closed = False
        self._held: list[bytes] = []
        self._started = not streamed or fmt.name != "wav"
        self._sink = StreamSink() if streamed else io.BytesIO()
        self._file: sf.SoundFile | None = None
        if fmt.container:
            self._file = sf.SoundFile(
                self._sink, "w", samplerate=rate, channels=1, format=fmt.container,
                subtype=fmt.subtype, compression_level=fmt.compression,
                bitrate_mode="CONSTANT" if fmt.name == "mp3" else None,
            )  # fmt: skip
            if fmt.container == "OGG":
                _set_page_latency(self._file, OGG_PAGE_MS)

    @property
    def closed(self) -> bool:
        """Finished or closed: nothing more comes out."""
        return self._closed

    @property
    def light(self) -> bool:
        """Streamed WAV and PCM only pass bytes through: cheap enough for the event loop."""
        return self._file is None and self.streamed

    def encode(self, pcm: bytes) -> bytes:
        """Encode one chunk of PCM16 little-endian mono samples."""
        with self._lock:
            if self._closed:
                return b""
            started = time.perf_counter()
            try:
                return self._encode(pcm)
            finally:
                self.seconds += time.perf_counter() - started

    def finish(self) -> bytes:
        """Flush the codec and end the stream: the last bytes (the whole file, unstreamed)."""
        with self._lock:
            if self._closed:
                return b""
            started = time.perf_counter()
            try:
                return self._finish()
            finally:
                self._closed = True
                self.seconds += time.perf_counter() - started

    def close(self) -> None:
        """Release the codec without using its output (the client left); idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                if self._file is not None:
                    self._file.close()

    def _encode(self, pcm: bytes) -> bytes:
        if self._file is None:
            if not self.streamed:
                self._held.append(pcm)
                return b""
            if not self._started:  # the WAV header goes out with the first audio
                self._started = True
                return streaming_header(self.rate) + pcm
            return pcm
        self._file.write(np.frombuffer(pcm, dtype="<i2"))
        return self._taken()

    def _finish(self) -> bytes:
        if self._file is None:
            if self.streamed:
                return b"" if self._started else streaming_header(self.rate)
            pcm = b"".join(self._held)
            self._held.clear()
            if self.format.name == "pcm":
                return pcm
            return wav_bytes(np.frombuffer(pcm, dtype="<i2"), self.rate)
        self._file.close()
        return self._taken()

    def _taken(self) -> bytes:
        if isinstance(self._sink, StreamSink):
            return self._sink.take()
        if self._file is not None and self._file.closed:
            return self._sink.getvalue()
        return b""


def _set_page_latency(file: sf.SoundFile, ms: float) -> None:
    """Cut Ogg pages every ``ms`` of audio (soundfile exposes no call for this command)."""
    value = sf._ffi.new("double[1]", [ms])
    sf._snd.sf_command(file._file, _OGG_PAGE_LATENCY_MS, value, sf._ffi.sizeof(value))


def encode_whole(fmt: OutputFormat, rate: int, pcm: bytes) -> bytes:
    """A complete file of ``pcm`` in ``fmt`` (exact sizes)."""
    encoder = Encoder(fmt, rate, streamed=False)
    encoder.encode(pcm)
    return encoder.finish()
