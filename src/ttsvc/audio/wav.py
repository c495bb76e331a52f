"""WAV containers for PCM16 mono.

A streamed response cannot know its length up front, so its header carries the largest sizes
(0xFFFFFFFF), which players and ffmpeg read as "until the stream ends". A finished file gets
exact sizes through the standard library's ``wave`` writer.
"""

from __future__ import annotations

import io
import struct
import wave
from pathlib import Path

import numpy as np
import numpy.typing as npt

_UNKNOWN = 0xFFFFFFFF


def streaming_header(sample_rate: int, channels: int = 1, sample_width: int = 2) -> bytes:
    """A 44-byte RIFF/WAVE header whose sizes mean "unknown, read to the end"."""
    byte_rate = sample_rate * channels * sample_width
    return b"".join(
        [
            b"RIFF", struct.pack("<I", _UNKNOWN), b"WAVE",
            b"fmt ", struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, byte_rate,
                                 channels * sample_width, sample_width * 8),
            b"data", struct.pack("<I", _UNKNOWN),
        ]
    )  # fmt: skip


def wav_bytes(pcm: npt.NDArray[np.int16], sample_rate: int) -> bytes:
    """A complete WAV file with exact sizes."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(np.ascontiguousarray(pcm, dtype="<i2").tobytes())
    return buf.getvalue()


def write_wav(path: Path, pcm: npt.NDArray[np.int16], sample_rate: int) -> None:
    """Write a complete WAV file."""
    path.write_bytes(wav_bytes(pcm, sample_rate))


def read_wav(path: Path) -> tuple[npt.NDArray[np.int16], int]:
    """Read a PCM16 mono WAV file: samples and sample rate."""
    with wave.open(str(path), "rb") as src:
        if src.getsampwidth() != 2 or src.getnchannels() != 1:
            raise ValueError(f"{path}: not PCM16 mono")
        return np.frombuffer(src.readframes(src.getnframes()), dtype="<i2"), src.getframerate()
