"""ElevenLabs' streaming-input WebSockets against a real ``ttsvc serve`` with keys on.

Pipecat's ``ElevenLabsTTSService`` and LiveKit's ``elevenlabs.TTS``, unchanged but for their base
URL, are fed an LLM's text token by token and must get audio and word times that fall where the
words are in that audio (the two read alignment times differently). A raw ``websockets`` client
checks the protocol itself: overlapping contexts, their alignment and ``isFinal``, an
interruption that stops the worker, the single-context ``stream-input``, and the refusals.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import re
import shutil
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.audio.decoding import rms
from tests.gateway.serving import Server, bearer, metric, wait_until
from tests.gateway.test_agent_clients import SLACK, needs
from ttsvc.repository.layout import EngineVersion

VOICE = "en_US-joe-medium"
TEXT = "Hello from a voice agent. The framework plays what ttsvc streams back."
RATE = 24000
PAUSE_S = 0.2
"""The pause between two sentences of a context."""
LONG = ("This long sentence keeps the worker busy for many seconds of speech, so that a "
        "client who interrupts it early finds it far from done, with a great deal left to make.")
RECV_S = 120
Message = dict[str, Any]
Pcm = npt.NDArray[np.int16]
pytestmark = [  # Pipecat's own modules use what it (and Python) deprecated: not ours to fix
    pytest.mark.filterwarnings("ignore:`AudioContextTTSService` is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:'audioop' is deprecated:DeprecationWarning"),
]


KEY_NAMES = ("alice", "interrupter")
"""The keys of this module's server (``keys``, ``keyed``: tests/gateway/conftest.py)."""


@pytest.fixture(scope="module")
def server(keyed: Server) -> Server:
    """The module's server has keys on (``keyed``)."""
    return keyed


@pytest.fixture(scope="module")
def reference_s(server: Server) -> float:
    """TEXT's duration from /synthesize (its two sentences and the pause between them)."""
    r = server.synth(TEXT, stream=False, format="pcm", sample_rate=RATE)
    assert r.status_code == 200, r.text
    return len(r.content) / 2 / RATE


def ws_url(srv: Server, route: str = "multi-stream-input", voice: str = VOICE,
           **query: str) -> str:  # fmt: skip
    params = "&".join(f"{k}={v}" for k, v in {"model_id": "eleven_flash_v2_5", **query}.items())
    return f"{srv.url.replace('http://', 'ws://')}/v1/text-to-speech/{voice}/{route}?{params}"


def open_ws(srv: Server, key: str, route: str = "multi-stream-input", voice: str = VOICE,
            **query: str) -> ClientConnection:  # fmt: skip
    return connect(ws_url(srv, route, voice, **query), additional_headers={"xi-api-key": key},
                   open_timeout=30)  # fmt: skip


def send(ws: ClientConnection, **fields: object) -> None:
    ws.send(json.dumps(fields))


def tokens(text: str) -> list[str]:
    """``text`` as an LLM sends it: word and space."""
    return re.findall(r"\S+\s*", text)


def read_contexts(ws: ClientConnection, contexts: set[str]) -> dict[str, list[Message]]:
    """Each context's messages up to its ``isFinal``; nothing may come for a context after it
    (or for a context not asked about)."""
    out: dict[str, list[Message]] = {c: [] for c in contexts}
    done: set[str] = set()
    while done != contexts:
        message = json.loads(ws.recv(timeout=RECV_S))
        cid = message.get("contextId")
        assert cid in contexts and cid not in done, message
        out[cid].append(message)
        if message.get("isFinal"):
            done.add(cid)
    return out


def read_to_close(ws: ClientConnection) -> list[Message]:
    out: list[Message] = []
    while True:
        try:
            out.append(json.loads(ws.recv(timeout=RECV_S)))
        except ConnectionClosed:
            return out


def audio_of(messages: list[Message]) -> bytes:
    return b"".join(base64.b64decode(m["audio"]) for m in messages if m.get("audio"))


def aligned_text(messages: list[Message], per_context: bool, rate: int = RATE,
                 width: int = 2) -> str:  # fmt: skip
    """The characters a context's audio messages carry, joined, after checking their times as
    the client reads them (``per_context``: ms from the context's first audio, LiveKit's
    reading; else from the end of the previous message's characters, Pipecat's): times never
    go back, each word starts within the audio of the message that carries it, and no character
    ends after the audio does."""
    chars: list[str] = []
    clock = audio_ms = edge = 0.0
    for m in messages:
        before = audio_ms
        audio_ms += len(base64.b64decode(m["audio"] or "")) / width / rate * 1000
        alignment = m.get("alignment")
        if alignment is None:
            continue
        assert m["normalizedAlignment"] == alignment
        base = 0.0 if per_context else clock
        starts = [base + s for s in alignment["charStartTimesMs"]]
        durations = alignment["charDurationsMs"]
        assert len(starts) == len(durations) == len(alignment["chars"]) > 0
        for char, start, duration in zip(alignment["chars"], starts, durations, strict=True):
            assert duration >= 0 and start >= edge - 1e-6, (char, start, edge)
            if char.isalnum() and (not chars or chars[-1] == " "):  # a word's first character
                assert before - 1 <= start <= audio_ms + 1, (char, start, before, audio_ms)
            chars.append(char)
            edge = start + duration
        clock = edge
    assert edge <= audio_ms + 1
    return "".join(chars)


def pause_of(pcm: Pcm, rate: int) -> tuple[float, float]:
    """Start and end (s) of the longest run of exact zeros, at least ``PAUSE_S`` long: the pause
    ttsvc puts between two sentences of one context (the voice's own quiet is never all
    zeros)."""
    zero = np.concatenate([[False], pcm == 0, [False]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(zero))
    runs = list(zip(edges[::2], edges[1::2], strict=True))
    start, end = max(runs, key=lambda r: r[1] - r[0])
    assert end - start >= round(PAUSE_S * rate) - 1, "no pause between the sentences"
    return start / rate, end / rate


def check_audio(pcm: Pcm, rate: int, reference_s: float) -> None:
    assert rms(pcm) > 300, "silence"
    assert abs(len(pcm) / rate - reference_s) <= SLACK * reference_s, (len(pcm) / rate,
                                                                       reference_s)  # fmt: skip


def requests_made(server: Server, fmt: str = "pcm") -> float:
    return metric(server, "ttsvc_format_requests_total", format=fmt, api="elevenlabs")


@needs("pipecat-ai")
def test_pipecat_elevenlabs_service_speaks_tokens_with_word_times(
    server: Server, key: str, reference_s: float
) -> None:
    """Pipecat's class as a pipeline drives it: an LLM's reply token by token, its sentences sent
    as they complete (without the space between them), a flush and a close at the reply's end.
    Each sentence is one request; the words' times (Pipecat adds each message's alignment to a
    running clock) put the second sentence's first word after the pause between them."""
    from pipecat.frames.frames import (  # noqa: PLC0415
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
        TTSAudioRawFrame,
        TTSTextFrame,
    )
    from pipecat.pipeline.worker import PipelineParams  # noqa: PLC0415
    from pipecat.services.elevenlabs.tts import ElevenLabsTTSService  # noqa: PLC0415
    from pipecat.tests.utils import run_test  # noqa: PLC0415

    before = requests_made(server)
    tts = ElevenLabsTTSService(api_key=key, url=server.url.replace("http://", "ws://"),
                               settings=ElevenLabsTTSService.Settings(voice=VOICE))  # fmt: skip
    frames = [LLMFullResponseStartFrame(), *(LLMTextFrame(t) for t in tokens(TEXT)),
              LLMFullResponseEndFrame()]  # fmt: skip
    down, _ = asyncio.run(run_test(tts, frames_to_send=frames,
                                   pipeline_params=PipelineParams(audio_out_sample_rate=RATE)))
    audio = [f for f in down if isinstance(f, TTSAudioRawFrame)]
    assert audio and {f.sample_rate for f in audio} == {RATE}
    pcm = np.frombuffer(b"".join(f.audio for f in audio), "<i2")
    check_audio(pcm, RATE, reference_s)
    assert requests_made(server) == before + 2  # one request per sentence
    words = [f for f in down if isinstance(f, TTSTextFrame)]
    assert [w.text for w in words] == TEXT.split()
    assert all(w.pts is not None for w in words)
    at = [(w.pts - words[0].pts) / 1e9 for w in words]  # type: ignore[operator]
    assert at == sorted(at)
    pause_start, pause_end = pause_of(pcm, RATE)
    second = TEXT.split().index("The")
    # the first word starts within half a second of the audio's start, as does "The" after the
    # pause; a clock that ran ahead or behind would put it elsewhere
    assert pause_end - 0.5 <= at[second] <= pause_end + 0.5, (at, pause_end)
    assert at[second - 1] < pause_start and at[-1] < len(pcm) / RATE


@needs("livekit-plugins-elevenlabs")
def test_livekit_elevenlabs_stream_speaks_tokens_with_timed_words(
    server: Server, key: str, reference_s: float
) -> None:
    """LiveKit's plugin as an agent drives it: ``stream()``, the reply pushed token by token,
    flush, end of input. It reads alignment times from the context's start
    (``sync_alignment=true``); its timed words must land in the audio it got."""
    import aiohttp  # noqa: PLC0415
    from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT  # noqa: PLC0415
    from livekit.plugins import elevenlabs  # noqa: PLC0415

    async def synthesize() -> tuple[bytes, set[int], list[Any]]:
        async with aiohttp.ClientSession() as http:
            tts = elevenlabs.TTS(base_url=f"{server.url}/v1", api_key=key, voice_id=VOICE,
                                 encoding="pcm_24000", http_session=http)  # fmt: skip
            try:
                stream = tts.stream()
                for token in tokens(TEXT):
                    stream.push_text(token)
                stream.flush()
                stream.end_input()
                pcm, rates, words = bytearray(), set(), []
                async for event in stream:
                    rates.add(event.frame.sample_rate)
                    pcm += bytes(event.frame.data.cast("B"))
                    words += event.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, [])
                await stream.aclose()
                return bytes(pcm), rates, words
            finally:
                await tts.aclose()

    before = requests_made(server)
    data, rates, words = asyncio.run(synthesize())
    assert rates == {RATE}
    pcm = np.frombuffer(data, "<i2")
    check_audio(pcm, RATE, reference_s)
    assert requests_made(server) == before + 2
    assert "".join(words) == TEXT + " "
    starts = [w.start_time for w in words]
    assert starts == sorted(starts) and all(w.start_time <= w.end_time for w in words)
    pause_start, pause_end = pause_of(pcm, RATE)
    second = [w.strip() for w in words].index("The")
    assert pause_end <= starts[second] <= pause_end + 0.5, (starts, pause_end)
    assert starts[second - 1] < pause_start and words[-1].end_time <= len(pcm) / RATE + 0.001


@pytest.mark.parametrize("per_context", [True, False], ids=["sync_alignment", "per_message"])
def test_overlapping_contexts_get_their_own_audio_alignment_and_final(
    server: Server, key: str, per_context: bool
) -> None:
    """Two contexts written at once, token by token, each ended by a flush and a close: each
    gets its own audio, characters that spell what it was sent (a space after each sentence)
    at times that fit its audio as either client reads them, and ``isFinal`` last."""
    texts = {"a": "The first context speaks here. It has two sentences.",
             "b": "A second one talks over it, at the same time. Then it ends too."}  # fmt: skip
    query = {"output_format": f"pcm_{RATE}", **({"sync_alignment": "true"} if per_context
                                                 else {})}  # fmt: skip
    with open_ws(server, key, **query) as ws:
        for cid in texts:  # as both clients open a context: a space and the voice settings
            send(ws, text=" ", voice_settings={"stability": 0.5, "speed": 1.0}, context_id=cid)
        for pair in itertools.zip_longest(*(tokens(t) for t in texts.values())):
            for cid, token in zip(texts, pair, strict=True):
                if token is not None:
                    send(ws, text=token, context_id=cid)
        send(ws, text="")  # Pipecat's keep-alive of the connection: ignored
        for cid in texts:
            send(ws, context_id=cid, flush=True)
            send(ws, context_id=cid, close_context=True)
        got = read_contexts(ws, set(texts))
        send(ws, close_socket=True)
        assert read_to_close(ws) == []
    assert ws.close_code == 1000
    for cid, text in texts.items():
        messages = got[cid]
        assert messages[-1] == {"isFinal": True, "contextId": cid}
        assert aligned_text(messages[:-1], per_context) == text + " "
        assert rms(np.frombuffer(audio_of(messages), "<i2")) > 300


def test_close_context_mid_stream_interrupts_and_cancels_the_worker(
    server: Server, keys: tuple[Path, dict[str, str]]
) -> None:
    """A barge-in: ``close_context`` while the context's audio streams (no flush before it). The
    sentence being synthesized is cancelled in the worker (recorded 499 ``cancelled``), the
    ones after it are never dispatched, ``isFinal`` comes at once and nothing after it."""
    srv = server
    with open_ws(srv, keys[1]["interrupter"], output_format=f"pcm_{RATE}") as ws:
        send(ws, text=" ", context_id="turn")
        send(ws, text=" ".join([LONG] * 3) + " And", context_id="turn")
        first = json.loads(ws.recv(timeout=RECV_S))
        assert first.get("audio") and first["contextId"] == "turn", first
        send(ws, context_id="turn", close_context=True)
        rest = read_contexts(ws, {"turn"})["turn"]
        assert rest[-1] == {"isFinal": True, "contextId": "turn"}
        send(ws, close_socket=True)
        assert read_to_close(ws) == []  # nothing more came for the context
    srv.wait_idle()
    lines = [e for e in srv.completions() if e["key"] == "interrupter"]
    assert [(e["code"], e["status"]) for e in lines] == [(499, "cancelled")], lines
    # the worker stopped it: once it has ended every stream, the sentence had not run to its end
    wait_until(srv, lambda: metric(srv, "ttsvc_streams_in_flight", worker="0"),
               lambda streams: streams == 0, "no stream left on the worker")  # fmt: skip
    assert not [e for e in srv.events()
                if e["event"] == "stream_done" and e.get("uid") == lines[0]["uid"]]  # fmt: skip


def test_stream_input_speaks_one_implicit_context_then_closes(server: Server, key: str) -> None:
    """The older ``stream-input``: no context ids, ``{"text": ""}`` ends the input; µ-law at
    8 kHz (``ulaw_8000``), and a voice named by an alias (OpenAI's ``alloy``)."""
    before = requests_made(server, "mulaw")
    text = "One short reply. And a second sentence."
    with open_ws(server, key, "stream-input", voice="alloy", output_format="ulaw_8000") as ws:
        send(ws, text=" ", voice_settings={"speed": 1.25})
        for token in tokens(text):
            send(ws, text=token)
        send(ws, text="")
        messages = read_to_close(ws)
    assert ws.close_code == 1000
    assert messages[-1] == {"isFinal": True}
    assert not [m for m in messages if "contextId" in m or "error" in m]
    assert aligned_text(messages[:-1], per_context=False, rate=8000, width=1) == text + " "
    assert len(audio_of(messages)) / 8000 > 1.0
    assert requests_made(server, "mulaw") == before + 2


def test_refusals_unknown_voice_bad_output_format_and_keys(server: Server, key: str) -> None:
    refused = metric(server, "ttsvc_requests_total", code="401", outcome="unauthorized")
    for headers in ({}, {"xi-api-key": "nope"}, bearer("nope")):
        with pytest.raises(InvalidStatus) as wrong:
            connect(ws_url(server), additional_headers=headers, open_timeout=30)
        assert wrong.value.response.status_code == 401
        assert json.loads(wrong.value.response.body or b"")["type"] == "unauthorized"
    assert metric(server, "ttsvc_requests_total", code="401",
                  outcome="unauthorized") == refused + 3  # fmt: skip
    with connect(ws_url(server), additional_headers=bearer(key), open_timeout=30) as ws:
        send(ws, close_socket=True)  # a key as Authorization: Bearer is taken too
        assert read_to_close(ws) == []
    with pytest.raises(InvalidStatus) as unknown:
        open_ws(server, key, voice="nobody")
    assert unknown.value.response.status_code == 404
    body = json.loads(unknown.value.response.body or b"")
    assert body["type"] == "unknown_voice" and VOICE in body["error"]
    for bad in ("opus_48000_64", "pcm_32000", "mp3_12000_32", "alaw_8000"):
        with open_ws(server, key, output_format=bad) as ws:
            messages = read_to_close(ws)
        assert ws.close_code == 1008
        assert [(m["type"], m["field"]) for m in messages] == [("invalid_parameter",
                                                                "output_format")]  # fmt: skip
        assert bad in messages[0]["error"]
    # a bad query is refused on its field before the voice is looked up (nor waited for)
    for query in ({"voice": "nobody", "output_format": "alaw_8000"}, {"auto_mode": "maybe"},
                  {"enable_ssml_parsing": "sometimes"}):  # fmt: skip
        with open_ws(server, key, **query) as ws:
            messages = read_to_close(ws)
        assert ws.close_code == 1008
        field = next(name for name in query if name != "voice")
        assert [(m["type"], m["field"]) for m in messages] == [("invalid_parameter", field)]
    with open_ws(server, key, output_format=f"pcm_{RATE}") as ws:  # bad messages: the socket stays
        ws.send(b"\x00")
        send(ws, text="no context")
        send(ws, text=" ", voice_settings={"speed": 9}, context_id="c")
        errors = [json.loads(ws.recv(timeout=RECV_S)) for _ in range(3)]
        assert [e["field"] for e in errors] == ["message", "context_id", "voice_settings.speed"]
        send(ws, close_socket=True)
        assert read_to_close(ws) == []


def test_v1_voices_lists_the_served_voice_in_elevenlabs_shape(server: Server, key: str) -> None:
    voices = server.client.get("/v1/voices").json()["voices"]
    listed = [(v["voice_id"], v["name"], v["category"]) for v in voices]
    assert listed == [(VOICE, VOICE, "premade")]
    assert voices[0]["labels"]["language"] == "en_US" and voices[0]["preview_url"] is None
    assert httpx.get(f"{server.url}/v1/voices", timeout=10).status_code == 401
    wrong = httpx.get(f"{server.url}/v1/voices", headers={"xi-api-key": "nope"}, timeout=10)
    assert wrong.status_code == 401


@needs("livekit-plugins-elevenlabs")
def test_livekit_lists_voices_with_its_key_header(server: Server, key: str) -> None:
    import aiohttp  # noqa: PLC0415
    from livekit.plugins import elevenlabs  # noqa: PLC0415

    async def voices() -> list[Any]:
        async with aiohttp.ClientSession() as http:
            tts = elevenlabs.TTS(base_url=f"{server.url}/v1", api_key=key, http_session=http)
            try:
                return await tts.list_voices()
            finally:
                await tts.aclose()

    assert [(v.id, v.name, v.category) for v in asyncio.run(voices())] == [(VOICE, VOICE,
                                                                            "premade")]  # fmt: skip


def first_audio(ws: ClientConnection) -> Message:
    """The first message with audio: the socket must send it with nothing more asked (a
    sentence held back for more text never comes, and the read times out)."""
    while True:
        message = json.loads(ws.recv(timeout=RECV_S))
        assert "error" not in message, message
        if message.get("audio"):
            return message


@pytest.mark.parametrize("query,text", [
    ({"auto_mode": "true"}, "Turn left at the next light"),  # a whole unit, even unended
    ({}, "Your table is ready."),  # a message that ends a sentence
])  # fmt: skip
def test_a_whole_sentence_is_spoken_without_waiting_for_more_text(
    server: Server, key: str, query: dict[str, str], text: str
) -> None:
    """Pipecat's ElevenLabs class sends whole sentences with ``auto_mode=true`` and no flush:
    its first audio must not wait for the LLM's next sentence."""
    with open_ws(server, key, output_format=f"pcm_{RATE}", **query) as ws:
        send(ws, text=text, context_id="turn")
        assert first_audio(ws)["contextId"] == "turn"
        send(ws, context_id="turn", flush=True)
        send(ws, context_id="turn", close_context=True)
        assert read_contexts(ws, {"turn"})["turn"][-1]["isFinal"]


def test_a_sentence_with_nothing_to_speak_is_a_short_silence_marked_so(
    server: Server, key: str
) -> None:
    """An emoji between two sentences of a context: its audio (after the pause) is 50 ms of
    zeros, marked ``empty_text``, recorded 200; no error, and the context ends final."""
    before = len(server.completions())
    with open_ws(server, key, "stream-input", output_format="pcm_16000") as ws:
        for token in tokens("Hello there. \U0001f642! See you soon."):
            send(ws, text=token)
        send(ws, text="")
        messages = read_to_close(ws)
    assert messages[-1] == {"isFinal": True} and not [m for m in messages if "error" in m]
    marked = [base64.b64decode(m["audio"] or "") for m in messages if m.get("empty_text")]
    assert b"".join(marked) == bytes(2 * round(0.05 * 16000))
    lines = server.completions()[before:]
    assert sorted((str(line["status"]), line["code"]) for line in lines) == [
        ("empty_text", 200), ("ok", 200), ("ok", 200)]  # fmt: skip


def test_empty_text_error_in_the_query_makes_such_a_sentence_an_error(
    server: Server, key: str
) -> None:
    with open_ws(server, key, "stream-input", output_format="pcm_16000",
                 empty_text="error") as ws:  # fmt: skip
        send(ws, text="\U0001f642! ")
        send(ws, text="")
        messages = read_to_close(ws)
    assert [m["type"] for m in messages if "error" in m] == ["empty_text"]
    assert messages[-1] == {"isFinal": True}
    with open_ws(server, key, empty_text="sometimes") as ws:
        messages = read_to_close(ws)
    assert ws.close_code == 1008
    assert [(m["type"], m["field"]) for m in messages] == [("invalid_parameter", "empty_text")]


def test_enable_ssml_parsing_reads_each_message_as_ssml(server: Server, key: str) -> None:
    """``enable_ssml_parsing=true``: a message's inline tags are read (a ``break`` is that much
    more audio) and its characters, tags and all, are aligned as sent; without it the same
    route reads text as text (a bare "&" is no markup error)."""
    texts = {"ssml": 'Hold on. <break time="2s"/> Okay.', "plain": "Hold on. Okay."}

    def spoken(query: dict[str, str], cid: str, text: str) -> list[Message]:
        with open_ws(server, key, output_format=f"pcm_{RATE}", auto_mode="true",
                     **query) as ws:  # fmt: skip
            send(ws, text=text, context_id=cid)
            send(ws, context_id=cid, flush=True)
            send(ws, context_id=cid, close_context=True)
            messages = read_contexts(ws, {cid})[cid]
        assert not [m for m in messages if "error" in m], messages
        return messages

    got = {cid: spoken({"enable_ssml_parsing": "true"}, cid, text)
           for cid, text in texts.items()}  # fmt: skip
    added = (len(audio_of(got["ssml"])) - len(audio_of(got["plain"]))) / 2 / RATE
    assert 1.6 < added < 2.6, added  # the break, give or take the voice's own variation
    chars = "".join("".join(m["alignment"]["chars"]) for m in got["ssml"] if m.get("alignment"))
    assert chars.strip() == texts["ssml"]
    assert audio_of(spoken({}, "unset", "Tom & Jerry."))


COPY = "en_US-copy-medium"
"""A second voice: the default voice's engine files under another name."""


def test_refusals_completion_lines_name_the_voice_asked_for(
    default_version: EngineVersion, tmp_path: Path
) -> None:
    """On a route for a voice that is not the default, a sentence refused (markup in error)
    and a query refused after the handshake are recorded with that voice, as every other
    request is (they named the default voice)."""
    engines = tmp_path / "engines"
    shutil.copytree(default_version.path, engines / VOICE / "1")
    shutil.copytree(default_version.path, engines / COPY / "1")
    srv = Server(engines, "--workers", "1")
    try:
        srv.wait_ready(1)
        wait_until(srv, lambda: srv.client.get("/voices").json()["voices"],
                   lambda v: {x["name"] for x in v if x["state"] == "serving"} == {VOICE, COPY},
                   "both voices")  # fmt: skip
        before = len(srv.completions())
        with open_ws(srv, "unused", "stream-input", voice=COPY, output_format=f"pcm_{RATE}",
                     enable_ssml_parsing="true", auto_mode="true") as ws:  # fmt: skip
            send(ws, text="Tom & Jerry.")
            send(ws, text="")
            messages = read_to_close(ws)
        assert [m["type"] for m in messages if "error" in m] == ["invalid_ssml"]
        with open_ws(srv, "unused", voice=COPY, output_format="alaw_8000") as ws:
            read_to_close(ws)
        assert ws.close_code == 1008
        lines = srv.completions()[before:]
        assert [(line["status"], line["voice"]) for line in lines] == [
            ("invalid_ssml", COPY), ("invalid_parameter", COPY)]  # fmt: skip
    finally:
        srv.stop()
