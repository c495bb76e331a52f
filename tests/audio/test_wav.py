"""WAV containers: streaming header fields and exact files."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from ttsvc.audio.wav import read_wav, streaming_header, wav_bytes, write_wav


def test_streaming_header_fields() -> None:
    header = streaming_header(22050)
    assert len(header) == 44
    assert header[:4] == b"RIFF" and header[8:16] == b"WAVEfmt "
    fmt = struct.unpack("<IHHIIHH", header[16:36])
    assert fmt == (16, 1, 1, 22050, 44100, 2, 16)
    assert header[36:40] == b"data"
    assert struct.unpack("<I", header[40:44])[0] == 0xFFFFFFFF


def test_exact_file_round_trip(tmp_path: Path) -> None:
    pcm = (np.sin(np.arange(1000) / 10) * 10000).astype(np.int16)
    path = tmp_path / "x.wav"
    write_wav(path, pcm, 16000)
    back, rate = read_wav(path)
    assert rate == 16000
    assert np.array_equal(back, pcm)
    assert wav_bytes(pcm, 16000)[44:] == pcm.astype("<i2").tobytes()
