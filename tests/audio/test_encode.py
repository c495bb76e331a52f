"""The encoder module: every format at every rate it allows, streamed and whole, and truncated;
every whole output read back by ``soundfile.read`` and by FFmpeg."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf

from tests.audio.decoding import Pcm, decode_both, decode_prefix, rms, ulaw_to_pcm
from ttsvc.audio.encode import FORMATS, Encoder, StreamSink, encode_whole

CASES = [(name, rate) for name, fmt in FORMATS.items() for rate in fmt.rates]
STREAMED = [(name, rate) for name, rate in CASES if FORMATS[name].streams]
LOSSLESS = {"wav", "pcm", "flac"}


def speechlike(rate: int, seconds: float = 1.5) -> Pcm:
    """A gliding tone with a syllable-rate envelope: voiced-speech-like, deterministic."""
    t = np.arange(int(rate * seconds)) / rate
    pitch = 120 + 80 * t / seconds
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    voice = np.sin(phase) + 0.5 * np.sin(2 * phase) + 0.25 * np.sin(3 * phase)
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 4 * t)
    return np.rint(6000 * voice * envelope).astype(np.int16)


def chunks(pcm: Pcm, rate: int) -> list[bytes]:
    """Chunk sizes like a worker's: a short first window, then growing ones."""
    sizes = [int(rate * 0.093), int(rate * 0.2), int(rate * 0.4)]
    out, start, i = [], 0, 0
    while start < len(pcm):
        size = sizes[min(i, len(sizes) - 1)]
        out.append(pcm[start : start + size].tobytes())
        start, i = start + size, i + 1
    return out


def stream(name: str, rate: int, pcm: Pcm) -> list[bytes]:
    """The pieces a streamed response sends: one per chunk, then the tail."""
    encoder = Encoder(FORMATS[name], rate, streamed=True)
    pieces = [encoder.encode(c) for c in chunks(pcm, rate)]
    pieces.append(encoder.finish())
    return pieces


def expected_length_slack(name: str, rate: int) -> int:
    """Samples a decoder may add: LAME's delay and padding, and its silent Info frame (streamed,
    the Info tag that tells decoders to trim them cannot be rewritten)."""
    if name != "mp3":
        return 0
    frame = 1152 if rate >= 32000 else 576  # MPEG-1 above 32 kHz, MPEG-2/2.5 below
    return 1105 + 3 * frame  # LAME's delay, the Info frame, and up to a frame of padding


@pytest.mark.parametrize(("name", "rate"), STREAMED)
def test_streamed_encoding_decodes_to_the_input(name: str, rate: int) -> None:
    pcm = speechlike(rate)
    data = b"".join(stream(name, rate, pcm))
    got, got_rate = decode_both(data, name, rate)
    assert got_rate == rate
    assert len(pcm) <= len(got) <= len(pcm) + expected_length_slack(name, rate)
    if name in LOSSLESS:
        assert np.array_equal(got, pcm)
    elif name == "mulaw":  # 8-bit log quantization: error within 1/16 of the sample, plus steps
        err = np.abs(got.astype(np.int32) - pcm)
        assert np.all(err <= np.abs(pcm.astype(np.int32)) // 16 + 16)
    else:  # lossy: same loudness, finite
        assert 0.7 < rms(got) / rms(pcm) < 1.3


def holdback(name: str, rate: int) -> int:
    """Samples a streaming codec may hold back before a piece goes out: LAME's look-ahead
    (counted as decoded samples, its delay and Info frame are audio too), a FLAC block, an Ogg
    page of 50 ms plus an Opus frame and the decoder's pre-skip."""
    return {"mp3": 1105 + 2 * (1152 if rate >= 32000 else 576),
            "opus": int(0.1 * rate)}.get(name, 0)  # fmt: skip


@pytest.mark.parametrize(("name", "rate"), STREAMED)
def test_every_received_prefix_decodes(name: str, rate: int) -> None:
    """A client that stops reading midway holds a valid stream of the audio so far, and each
    piece carries the audio given with it, less what the codec must hold back."""
    pcm = speechlike(rate)
    pieces = stream(name, rate, pcm)
    data = b"".join(pieces)
    full, _ = decode_prefix(data, name, rate)
    sizes = [len(c) // 2 for c in chunks(pcm, rate)]
    sent, given, last = 0, 0, 0
    for index, piece in enumerate(pieces[:-1]):
        sent, given = sent + len(piece), given + sizes[index]
        cuts = [sent, sent - 7] if index else [sent]  # a cut inside the headers holds no stream
        for cut in cuts:
            prefix = data[:cut]
            if index == 0 and given <= holdback(name, rate) and len(piece) <= 1024:
                continue  # the codec holds all of it: only headers went out (MP3 at 8 kHz)
            got, _ = decode_prefix(prefix, name, rate)
            assert np.all(np.isfinite(got))
            if name in LOSSLESS:
                assert np.array_equal(got, pcm[: len(got)])
            if cut == sent:
                assert given - len(got) <= holdback(name, rate), (index, given, len(got))
                assert last <= len(got) <= len(full)
                last = len(got)


@pytest.mark.parametrize("name", ["mp3", "opus", "flac", "wav", "pcm", "mulaw"])
def test_whole_file_has_exact_sizes(name: str) -> None:
    rate = FORMATS[name].default_rate or 22050
    pcm = speechlike(rate)
    data = encode_whole(FORMATS[name], rate, pcm.tobytes())
    got, got_rate = decode_both(data, name, rate)
    assert got_rate == rate
    if name in ("wav", "flac"):
        assert sf.info(io.BytesIO(data)).frames == len(pcm)  # the header's count is exact
    if name in LOSSLESS:
        assert np.array_equal(got, pcm)
    assert abs(len(got) - len(pcm)) <= expected_length_slack(name, rate)


def test_streamed_wav_sizes_read_as_to_the_end() -> None:
    """A streamed WAV's header cannot know its sizes: its largest values, which both readers take
    as "to the end of the file", and not a count that would cut the audio short or overrun."""
    pcm = speechlike(22050)
    data = b"".join(stream("wav", 22050, pcm))
    assert data[4:8] == data[40:44] == b"\xff\xff\xff\xff"  # RIFF and data chunk sizes
    assert sf.info(io.BytesIO(data)).frames == len(pcm)
    got, _ = decode_both(data, "wav", 22050)
    assert np.array_equal(got, pcm)


def test_flac_is_only_encoded_whole() -> None:
    """A FLAC stream would go out with an unknown sample count, which ``soundfile.read``
    cannot read: FLAC is a whole-file format."""
    assert not FORMATS["flac"].streams
    with pytest.raises(ValueError, match="whole"):
        Encoder(FORMATS["flac"], 22050, streamed=True)
    data = encode_whole(FORMATS["flac"], 22050, speechlike(22050).tobytes())
    assert np.array_equal(decode_both(data, "flac")[0], speechlike(22050))


def test_mulaw_is_g711() -> None:
    """libsndfile's µ-law bytes expand, by the G.711 formula, to the input within quantization."""
    pcm = np.array([0, 1, -1, 100, -100, 1000, -1000, 8000, -8000, 32767, -32768], np.int16)
    data = encode_whole(FORMATS["mulaw"], 8000, pcm.tobytes())
    assert len(data) == len(pcm)  # one byte a sample, no header
    back = ulaw_to_pcm(data)
    err = np.abs(back.astype(np.int32) - pcm)
    assert np.all(err <= np.abs(pcm.astype(np.int32)) // 16 + 16)


@pytest.mark.parametrize(("name", "rate"), [("opus", 22050), ("opus", 44100), ("mulaw", 16000)])
def test_illegal_rates_are_refused(name: str, rate: int) -> None:
    why = FORMATS[name].rate_error(rate)
    assert why is not None and "sample_rate" in why
    with pytest.raises(ValueError, match="sample_rate"):
        Encoder(FORMATS[name], rate, streamed=True)


def test_opus_names_only_the_rates_it_is_offered_at() -> None:
    """Opus defines 12 kHz, but no client may ask for it (it is no output rate here): the error
    lists what a request can use."""
    why = FORMATS["opus"].rate_error(22050)
    assert why is not None and why.endswith("opus accepts 8000, 16000, 24000, 48000")
    assert "12000" not in why  # it was named as if a request could ask for it


def test_closing_midway_releases_the_codec() -> None:
    encoder = Encoder(FORMATS["mp3"], 24000, streamed=True)
    assert encoder.encode(speechlike(24000, 0.3).tobytes())
    encoder.close()
    encoder.close()
    assert encoder.encode(b"\0\0" * 100) == b"" and encoder.finish() == b""


def test_stream_sink_drops_rewrites_of_sent_bytes() -> None:
    sink = StreamSink()
    sink.write(b"header--")
    sink.write(b"data")
    assert sink.take() == b"header--data"
    sink.seek(2)
    sink.write(b"XY")  # a header fix-up on close: those bytes are gone already
    sink.seek(0, io.SEEK_END)
    sink.write(b"tail")
    sink.seek(10)
    sink.write(b"TAIL++!!")  # straddles the end: only the new part counts
    assert sink.take() == b"tail!!"
    assert sink.tell() == 18
