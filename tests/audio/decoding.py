"""Decoders the tests check encoded audio with: libsndfile's readers (libmpg123, libopus,
libFLAC, not the encoders under test), Python's ``wave`` for WAV and the G.711 formula for µ-law."""

from __future__ import annotations

import io
import wave

import numpy as np
import numpy.typing as npt
import soundfile as sf

Pcm = npt.NDArray[np.int16]

_BLOCK = 8192


def decode(data: bytes, fmt: str, rate: int | None = None) -> tuple[Pcm, int]:
    """Samples and rate of an encoded response (``rate`` is needed for headerless formats)."""
    if fmt == "pcm":
        assert rate is not None
        return np.frombuffer(data, dtype="<i2").copy(), rate
    if fmt == "mulaw":
        assert rate is not None
        return ulaw_to_pcm(data), rate
    if fmt == "wav" and data[4:8] != b"\xff\xff\xff\xff":
        with wave.open(io.BytesIO(data)) as w:
            return np.frombuffer(w.readframes(w.getnframes()), "<i2").copy(), w.getframerate()
    return read_all(data)


def read_all(data: bytes) -> tuple[Pcm, int]:
    """Every sample libsndfile can decode from ``data``, read block by block to its end.

    soundfile's own ``read`` first asks the position, which a FLAC stream of unknown length (a
    streamed response: its sample count is 0, "unknown") cannot answer, so this calls libsndfile's
    ``sf_readf_short`` directly. A truncated last frame is dropped, as a player would drop it.
    """
    pieces: list[Pcm] = []
    with sf.SoundFile(io.BytesIO(data)) as f:
        rate = int(f.samplerate)
        buf = np.empty(_BLOCK, dtype=np.int16)
        ptr = sf._ffi.cast("short *", buf.ctypes.data)
        while (n := sf._snd.sf_readf_short(f._file, ptr, _BLOCK)) > 0:
            pieces.append(buf[:n].copy())
    return (np.concatenate(pieces) if pieces else np.zeros(0, np.int16)), rate


def ulaw_to_pcm(data: bytes) -> Pcm:
    """G.711 µ-law expansion (ITU-T G.711 / Sun's reference formula), independent of libsndfile."""
    u = ~np.frombuffer(data, dtype=np.uint8)
    sign = (u & 0x80) != 0
    exponent = (u >> 4) & 0x07
    mantissa = u & 0x0F
    magnitude = (((mantissa.astype(np.int32) << 3) + 0x84) << exponent) - 0x84
    return np.where(sign, -magnitude, magnitude).astype(np.int16)


def rms(pcm: Pcm) -> float:
    return float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2))) if len(pcm) else 0.0
