"""Decoders the tests check encoded audio with, as clients read it: ``soundfile.read``
(libsndfile's readers: libmpg123, libopus, libFLAC, not the encoders under test) and FFmpeg's
decoders (through PyAV, which bundles FFmpeg's libraries), plus the G.711 formula for µ-law."""

from __future__ import annotations

import io

import av
import numpy as np
import numpy.typing as npt
import soundfile as sf

Pcm = npt.NDArray[np.int16]

_BLOCK = 8192
_RAW = {"pcm": "PCM_16", "mulaw": "ULAW"}
"""Headerless formats: libsndfile's subtype for each (the rate is told, not read)."""
_FFMPEG_RAW = {"pcm": "s16le", "mulaw": "mulaw"}
"""Headerless formats: FFmpeg's demuxer for each."""


def decode(data: bytes, fmt: str, rate: int | None = None) -> tuple[Pcm, int]:
    """Samples and rate of a whole response by ``soundfile.read``, the call a client makes on
    the body it got (``rate`` is needed for headerless formats)."""
    if fmt in _RAW:
        assert rate is not None
        pcm, got = sf.read(io.BytesIO(data), dtype="int16", format="RAW", subtype=_RAW[fmt],
                           samplerate=rate, channels=1, endian="LITTLE")  # fmt: skip
    else:
        pcm, got = sf.read(io.BytesIO(data), dtype="int16")
    assert pcm.ndim == 1, "mono"
    return pcm, int(got)


def decode_ffmpeg(data: bytes, fmt: str, rate: int | None = None) -> tuple[Pcm, int]:
    """Samples and rate of a whole response by FFmpeg's demuxers and decoders (what ``ffmpeg
    -i`` does). FFmpeg's Opus decoder always gives 48 kHz, whatever rate the stream was made at."""
    options = {}
    if fmt in _FFMPEG_RAW:
        assert rate is not None
        options = {"sample_rate": str(rate)}
    pieces: list[Pcm] = []
    got = 0
    with av.open(io.BytesIO(data), format=_FFMPEG_RAW.get(fmt), options=options) as container:
        for frame in container.decode(audio=0):
            assert frame.layout.nb_channels == 1, "mono"
            samples = frame.to_ndarray().reshape(-1)
            if samples.dtype.kind == "f":  # lossy decoders give floats in [-1, 1]
                samples = np.clip(np.rint(samples * 32768.0), -32768, 32767)
            pieces.append(samples.astype(np.int16))
            got = frame.sample_rate
    return (np.concatenate(pieces) if pieces else np.zeros(0, np.int16)), got


def decode_both(data: bytes, fmt: str, rate: int | None = None) -> tuple[Pcm, int]:
    """``decode``, after checking that FFmpeg reads the same audio from ``data``: the same
    samples for the lossless formats and µ-law, the same duration within a codec frame else."""
    pcm, got = decode(data, fmt, rate)
    other, other_rate = decode_ffmpeg(data, fmt, rate)
    if fmt in ("wav", "pcm", "flac", "mulaw"):
        assert other_rate == got and np.array_equal(other, pcm), (fmt, len(other), len(pcm))
    else:
        assert other_rate == (48000 if fmt == "opus" else got)
        frame_s = 1152 / got if fmt == "mp3" else 0.02  # an MP3 frame; an Opus frame
        assert abs(len(other) / other_rate - len(pcm) / got) <= frame_s, (fmt, len(other))
        assert 0.7 < (rms(other) + 1) / (rms(pcm) + 1) < 1.3
    return pcm, got


def read_all(data: bytes) -> tuple[Pcm, int]:
    """Every sample libsndfile can decode from a stream cut anywhere, read block by block to its
    end, as a player reads the part of a stream it received.

    ``soundfile.read`` first asks for the length, which a cut Ogg stream, whose last page is
    partial, may not answer; this calls libsndfile's ``sf_readf_short`` directly. A truncated
    last frame is dropped, as a player would drop it.
    """
    pieces: list[Pcm] = []
    with sf.SoundFile(io.BytesIO(data)) as f:
        rate = int(f.samplerate)
        buf = np.empty(_BLOCK, dtype=np.int16)
        ptr = sf._ffi.cast("short *", buf.ctypes.data)
        while (n := sf._snd.sf_readf_short(f._file, ptr, _BLOCK)) > 0:
            pieces.append(buf[:n].copy())
    return (np.concatenate(pieces) if pieces else np.zeros(0, np.int16)), rate


def decode_prefix(data: bytes, fmt: str, rate: int | None = None) -> tuple[Pcm, int]:
    """The audio in the part of a streamed response a client received before it hung up."""
    if fmt == "pcm":
        assert rate is not None
        return np.frombuffer(data[: len(data) // 2 * 2], dtype="<i2").copy(), rate
    if fmt == "mulaw":
        assert rate is not None
        return ulaw_to_pcm(data), rate
    return read_all(data)


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
