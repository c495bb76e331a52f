"""Texts that crashed espeak-ng, sent to a real server while another stream runs on the same worker.

Every one must answer 200 with audio or a 422 naming ``text``, and the stream already running on
that worker must finish whole, on the same worker process, with no worker death in the log.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import httpx
import numpy as np

from tests.gateway.serving import Server
from ttsvc.text.poison import NEIGHBOURS, POISON

DET = {"noise_scale": 0.0, "noise_w": 0.0}
LONG_TEXT = (
    "This stream shares its worker with every poisoned request, and it has to arrive whole. "
) * 40


def _pcm(body: bytes) -> np.ndarray:  # type: ignore[type-arg]
    assert body[:4] == b"RIFF"
    return np.frombuffer(body[44:], dtype="<i2")


def _answer(server: Server, text: str) -> str:
    """Send one poison text; read the first audio chunk (then hang up) or the error body."""
    with httpx.Client(base_url=server.url, timeout=60) as client:
        with client.stream("POST", "/synthesize", json={"text": text}) as r:
            if r.status_code == 200:
                first = next(r.iter_bytes())
                assert first[:4] == b"RIFF" and len(first) > 44
                return "200"
            r.read()
            assert r.status_code == 422, r.text
            body = r.json()
            assert body["field"] == "text" and body["error"] and body["type"]
            return f"422 {body['type']}"


def test_poison_texts_leave_the_worker_and_its_other_stream_alone(server: Server) -> None:
    pids = server.worker_pids()
    chunks: list[bytes] = []
    flowing = threading.Event()
    ended = threading.Event()

    def long_stream() -> None:
        with httpx.Client(base_url=server.url, timeout=300) as client:
            body = {"text": LONG_TEXT, **DET}
            with client.stream("POST", "/synthesize", json=body) as r:
                assert r.status_code == 200
                for chunk in r.iter_bytes():
                    chunks.append(chunk)
                    flowing.set()
        ended.set()

    reader = threading.Thread(target=long_stream)
    reader.start()
    assert flowing.wait(timeout=120), server.log_tail()
    answers = {name: _answer(server, text) for name, text in {**POISON, **NEIGHBOURS}.items()}
    # the corpus ran while the long stream was still being produced on the same worker
    overlapped = not ended.is_set()
    reader.join(timeout=300)
    assert not reader.is_alive()
    assert overlapped, "the long stream ended before the corpus was sent: lengthen it"

    log = "\n".join(server.log_lines())
    assert "worker_died" not in log, server.log_tail()
    assert server.worker_pids() == pids
    assert all(answers[name] == "200" for name in NEIGHBOURS), answers
    # the long stream is whole: the same samples as the same text synthesized alone afterwards
    alone = server.client.post("/synthesize", json={"text": LONG_TEXT, **DET})
    assert alone.status_code == 200
    streamed, expected = _pcm(b"".join(chunks)), _pcm(alone.content)
    assert streamed.shape == expected.shape
    # window sizes follow load, and windows agree with one-shot to ~1e-6: one PCM16 step apart
    assert np.abs(streamed.astype(np.int32) - expected).max() <= 1


def _espeak_child(worker: int) -> int:
    # every thread's children: the child is replaced by whichever compute thread found it dead
    children = [pid for task in Path(f"/proc/{worker}/task").iterdir()
                for pid in (task / "children").read_text().split()]  # fmt: skip
    found = [int(pid) for pid in children
             if b"espeak_child" in Path(f"/proc/{pid}/cmdline").read_bytes()]  # fmt: skip
    assert len(found) == 1, "the worker runs espeak-ng in one child process"
    return found[0]


def test_a_hung_phonemizer_costs_one_request_a_422_not_the_worker(server: Server) -> None:
    [worker] = server.worker_pids()
    assert server.synth("Warm up first.").status_code == 200
    hung = _espeak_child(worker)
    os.kill(hung, signal.SIGSTOP)  # a real hang inside espeak-ng: its process never answers
    r = server.client.post("/synthesize", json={"text": "Nobody will phonemize this one."})
    assert r.status_code == 422, r.text
    assert r.json()["type"] == "unspeakable_text" and r.json()["field"] == "text"
    assert server.synth("The next request is served.").status_code == 200
    assert server.worker_pids() == [worker]
    assert _espeak_child(worker) != hung
    assert "worker_died" not in "\n".join(server.log_lines())
