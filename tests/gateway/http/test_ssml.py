"""SSML on a real `ttsvc serve`: every text API reads it, marks come back in the timestamped
outputs at their audio times, word spans index the document, and the bad-input corpus is a
4xx naming the fault without a worker's help."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from websockets.sync.client import connect

from tests.gateway.serving import Server
from ttsvc.repository.layout import EngineVersion

STILL = {"noise_scale": 0.0, "noise_w": 0.0}
RATE = 22050
DOC = (
    '<speak><mark name="start"/>Call <say-as interpret-as="telephone">555-0123</say-as> '
    '<mark name="mid"/>now.<break time="700ms"/> <sub alias="World Wide Web">WWW</sub>.'
    '<mark name="end"/></speak>'
)


@pytest.fixture(scope="module")
def server(default_version: EngineVersion, engines_root: Path) -> Iterator[Server]:
    srv = Server(engines_root, "--workers", "1")
    srv.wait_ready(1)
    yield srv
    srv.stop()


def pcm_of(server: Server, text: str, **kw: object) -> bytes:
    r = server.synth(text, format="pcm", **STILL, **kw)
    assert r.status_code == 200, r.text
    return r.content


def test_a_break_adds_its_time_on_synthesize(server: Server) -> None:
    plain = pcm_of(server, "<speak>One. Two.</speak>")
    broken = pcm_of(server, '<speak>One. <break time="700ms"/>Two.</speak>')
    assert (len(broken) - len(plain)) // 2 == round(0.7 * RATE)
    # read as text when asked, markup and all: a different (longer) utterance
    assert len(pcm_of(server, "<speak>One. Two.</speak>", ssml=False)) > len(plain)


def test_marks_and_spans_on_the_timestamped_route(server: Server) -> None:
    r = server.client.post("/synthesize/with-timestamps", json={"text": DOC, **STILL})
    assert r.status_code == 200, r.text
    *chunks, done = [json.loads(line) for line in r.text.splitlines()]
    assert done["done"] is True
    words = [w for c in chunks for w in c["words"]]
    marks = {m["mark"]: m for c in chunks for m in c.get("marks", [])}
    assert set(marks) == {"start", "mid", "end"}
    spans = [DOC[w["text_span"][0] : w["text_span"][1]] for w in words]
    assert spans[0] == "Call" and "555-0123" in spans and spans[-1] == "WWW"
    now = next(w for w in words if w["word"] == "now")
    assert marks["mid"]["time"] == now["start"]
    audio = sum(len(base64.b64decode(c["audio"])) for c in chunks) // 2
    assert abs(marks["end"]["time"] - audio / RATE) < 256 / RATE
    assert DOC[marks["mid"]["text_span"][0] :].startswith('<mark name="mid"')


def test_openai_reads_ssml_input(server: Server) -> None:
    body = {"model": "tts-1", "voice": "alloy", "response_format": "pcm"}
    plain = server.client.post("/v1/audio/speech", json={**body, "input": "<speak>One. Two."
                                                          "</speak>"})  # fmt: skip
    paused = server.client.post("/v1/audio/speech", json={
        **body, "input": '<speak>One. <break time="2s"/>Two.</speak>'})  # fmt: skip
    assert plain.status_code == paused.status_code == 200
    # OpenAI's 24 kHz; the voice's noise is on here, so only the break's size is compared
    assert (len(paused.content) - len(plain.content)) / 2 / 24000 > 1.5
    bad = server.client.post("/v1/audio/speech", json={**body, "input": "<speak><s>x</speak>"})
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "input"


def test_a_websocket_append_may_be_a_document(server: Server) -> None:
    url = server.url.replace("http", "ws") + "/synthesize/stream"
    with connect(url) as ws:
        ws.send(json.dumps({"type": "start", "timestamps": True, **STILL}))
        assert json.loads(ws.recv())["type"] == "started"
        ws.send(json.dumps({"type": "append", "text": "Plain first. "}))
        ws.send(json.dumps({"type": "append", "text": DOC}))
        ws.send(json.dumps({"type": "end"}))
        messages = []
        while (msg := json.loads(ws.recv()))["type"] != "done":
            assert msg["type"] == "audio", msg
            messages.append(msg)
    marks = {m["mark"]: m for msg in messages for m in msg.get("marks", [])}
    assert set(marks) == {"start", "mid", "end"}
    at = len("Plain first. ")  # spans index the session's whole text
    words = [w for msg in messages for w in msg.get("words", [])]
    call = next(w for w in words if w["word"] == "Call")
    assert call["text_span"][0] == at + DOC.index("Call")
    assert marks["start"]["time"] == call["start"]


XXE = (
    '<?xml version="1.0"?><!DOCTYPE speak [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
    "<speak>&x;</speak>"
)
LAUGHS = (
    '<?xml version="1.0"?><!DOCTYPE speak [<!ENTITY a "lol"><!ENTITY b "&a;&a;&a;&a;'
    '&a;&a;&a;&a;"><!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;">]><speak>&c;</speak>'
)


@pytest.mark.parametrize("doc,says", [
    (XXE, "DTD"),
    (LAUGHS, "DTD"),
    ("<speak>" + "<s>" * 500 + "x" + "</s>" * 500 + "</speak>", "deeper than"),
    ('<speak>Sleep <break time="36000s"/></speak>', "break may last"),
    ("<speak>Go <audio src='x.wav'/></speak>", "<audio> is not an SSML element"),
    ('<speak><phoneme ph="ꭗa">x</phoneme></speak>', "U+AB57"),
    ('<speak><voice name="../../etc/passwd">x</voice></speak>', "no paths"),
    ("<speak>Hi <s>there</speak>", "line 1, column"),
    ("<speak><phoneme alphabet='ipa' ph='" + "ʔ" * 3000 + "'>x</phoneme></speak>",
     "more than the 200 a sentence may hold (max_sentence_chars)"),
])  # fmt: skip
def test_bad_input_is_a_clear_4xx_and_no_stream(server: Server, doc: str, says: str) -> None:
    before = len(server.completions())
    r = server.synth(doc, **STILL)
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["type"] == "invalid_ssml" and body["field"] == "text" and says in body["error"]
    server.wait_idle()
    (line,) = server.completions()[before:]  # recorded once, refused before any worker
    assert line["status"] == "invalid_ssml" and line["worker"] is None
    assert line["text_len"] == len(doc)


def test_a_ten_thousand_deep_document_is_refused_by_its_size(server: Server) -> None:
    deep = "<speak>" + "<s>" * 10_000 + "x" + "</s>" * 10_000 + "</speak>"
    r = server.synth(deep)
    assert r.status_code == 413 and "body over" in r.json()["error"]
