"""Many voices, one service: every voice under the engines directory served at once.

Two real voices (the packaged one and the derived British, 16 kHz, slower one of
``tests/voices.py``, compiled by the real ``ttsvc compile``) on a real server with real worker
processes: requests pick a voice by name or alias, both are served concurrently and correctly, a
hot swap of one leaves the other alone, a worker under a small memory budget lets go of the voice
it used least recently and loads it again when asked, and a voice mounted while the service runs
is picked up. A derived three-speaker voice (``tests/speakers.py``) takes a speaker by name or id.
"""

from __future__ import annotations

import base64
import io
import json
import shutil
import threading
import wave
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.engine_files import VOICE, publish, variant
from tests.gateway.serving import Server, voices, wait_voices
from tests.speakers import SPEAKERS
from tests.voices import SECOND_SAMPLE_RATE, SECOND_VOICE
from ttsvc.backends.loader import load_engine_set
from ttsvc.repository.layout import EngineVersion
from ttsvc.synthesis import SynthesisParams, Synthesizer

# the module's first test may compile the derived voice (``second_voice_root``) first
pytestmark = pytest.mark.timeout(900)

DET = {"noise_scale": 0.0, "noise_w": 0.0}
TEXT = "Two voices, one service. Each speaks as its own config says."


@pytest.fixture(scope="module")
def root(second_voice_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This module's copy of the two-voice engines directory (its tests publish into it)."""
    copy = tmp_path_factory.mktemp("voices") / "engines"
    shutil.copytree(second_voice_root, copy)
    return copy


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[Server]:
    srv = Server(root, "--workers", "2", "--voice-alias", f"narrator={SECOND_VOICE}",
                 env={"TTSVC_WATCH_SETTLE_S": "0.3"})  # fmt: skip
    srv.wait_ready(2)
    wait_voices(srv, lambda v: all(e["state"] == "serving" for e in v.values()) and len(v) == 2,
                "both voices serving")  # fmt: skip
    yield srv
    srv.stop()


def pcm(response: httpx.Response) -> tuple[int, np.ndarray]:  # type: ignore[type-arg]
    """Rate and samples of a whole WAV response."""
    assert response.status_code == 200, response.text
    with wave.open(io.BytesIO(response.content)) as w:
        return w.getframerate(), np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")


def reference(root: Path, voice: str, version: int = 1) -> np.ndarray:  # type: ignore[type-arg]
    """The voice's audio for ``TEXT`` computed here in one piece, from the same engine files."""
    synth = Synthesizer(load_engine_set(root / voice / str(version)))
    return synth.synthesize(TEXT, SynthesisParams(noise_scale=0.0, noise_w=0.0))


def test_every_voice_is_listed_with_its_own_details(server: Server) -> None:
    found = voices(server)
    assert list(found) == [VOICE, SECOND_VOICE]  # the default first
    first, second = found[VOICE], found[SECOND_VOICE]
    assert first["default"] is True and second["default"] is False
    assert first["language"]["code"] == "en_US"  # type: ignore[index]
    assert second["language"]["code"] == "en_GB"  # type: ignore[index]
    assert (first["sample_rate"], second["sample_rate"]) == (22050, SECOND_SAMPLE_RATE)
    assert (first["quality"], second["quality"]) == ("medium", "low")
    assert "nova" in first["aliases"] and second["aliases"] == ["narrator"]  # type: ignore[operator]
    assert second["engine_versions"] == ["1"]


def test_concurrent_requests_to_both_voices_are_each_correct(server: Server, root: Path) -> None:
    expected = {VOICE: reference(root, VOICE), SECOND_VOICE: reference(root, SECOND_VOICE)}
    results: dict[tuple[str, int], httpx.Response] = {}

    def call(voice: str, n: int) -> None:
        with httpx.Client(base_url=server.url, timeout=120) as client:
            results[voice, n] = client.post("/synthesize", json={
                "text": TEXT, "voice": voice, "stream": False, **DET})  # fmt: skip

    calls = [threading.Thread(target=call, args=(v, n)) for n in range(3) for v in expected]
    for t in calls:
        t.start()
    for t in calls:
        t.join()
    for (voice, _), response in results.items():
        rate, samples = pcm(response)
        assert rate == (22050 if voice == VOICE else SECOND_SAMPLE_RATE)
        assert response.headers["x-sample-rate"] == str(rate)
        want = expected[voice]
        assert samples.shape == want.shape, voice
        assert np.max(np.abs(samples.astype(np.int32) - want)) <= 33, voice  # 1e-3 full scale
    # the derived voice speaks 1.3 times slower: more samples per second of its rate's clock too
    default_s = len(expected[VOICE]) / 22050
    derived_s = len(expected[SECOND_VOICE]) / SECOND_SAMPLE_RATE
    assert derived_s > 1.5 * default_s  # 1.3 x the frames, each 22050/16000 times longer


def test_aliases_and_openai_names_pick_voices(server: Server) -> None:
    aliased = server.synth("Hello.", voice="narrator")
    assert aliased.status_code == 200 and aliased.headers["x-sample-rate"] == "16000"
    named = server.synth("Hello.", voice="nova")  # OpenAI's names map to the default voice
    assert named.status_code == 200 and named.headers["x-sample-rate"] == "22050"
    openai = server.client.post("/v1/audio/speech", json={
        "model": "tts-1", "input": "Hello.", "voice": "narrator", "response_format": "wav"})
    assert openai.status_code == 200, openai.text
    unknown = server.synth("Hello.", voice="en_US-nobody-medium")
    assert unknown.status_code == 404
    body = unknown.json()
    assert body["type"] == "unknown_voice" and body["field"] == "voice"
    assert SECOND_VOICE in body["error"] and VOICE in body["error"]


def test_ssml_switches_voices_inside_one_request(server: Server) -> None:
    """One stream, two voices: the other voice's run is resampled to the request voice's rate
    (both ways: 16000 Hz into 22050 Hz and back), word times cover both."""
    alone = server.synth("Hello there.", format="pcm", **DET)
    for voice, rate, other in ((VOICE, 22050, "narrator"), (SECOND_VOICE, 16000, VOICE)):
        mixed = server.client.post("/synthesize/with-timestamps", json={
            "text": f'<speak>Hello there. <voice name="{other}">Good day to you.</voice></speak>',
            "voice": voice, **DET})  # fmt: skip
        assert mixed.status_code == 200, mixed.text
        assert mixed.headers["x-sample-rate"] == str(rate)
        lines = [json.loads(line) for line in mixed.text.splitlines()]
        assert lines[-1]["done"] is True
        said = [w["word"] for line in lines[:-1] for w in line["words"]]
        assert said == ["Hello", "there", "Good", "day", "to", "you"]
        samples = sum(len(base64.b64decode(line["audio"])) for line in lines[:-1]) // 2
        assert samples / rate > len(alone.content) / 2 / 22050 + 0.5  # both sentences said
    unknown = server.synth('<speak><voice name="en_US-nobody">Hi.</voice></speak>')
    assert unknown.status_code == 422 and "not a voice this service serves" in unknown.text


def test_a_hot_swap_of_one_voice_leaves_the_other_untouched(
    server: Server, root: Path, tmp_path: Path
) -> None:
    before = voices(server)[VOICE]
    changed = tmp_path / "vocoder.onnx"
    variant(root / SECOND_VOICE / "1" / "vocoder.onnx", changed, 0.9)
    failures: list[str] = []
    stop = threading.Event()

    def keep_asking() -> None:  # the default voice serves throughout, on its own version
        with httpx.Client(base_url=server.url, timeout=120) as client:
            while not stop.is_set():
                r = client.post("/synthesize", json={"text": "Still here.", "voice": VOICE})
                if r.status_code != 200 or r.headers["x-engine-version"] != "1":
                    failures.append(f"{r.status_code} {r.headers.get('x-engine-version')}")

    asker = threading.Thread(target=keep_asking)
    asker.start()
    try:
        version = publish(root, {"vocoder.onnx": changed}, voice=SECOND_VOICE)
        after = wait_voices(
            server,
            lambda v: v[SECOND_VOICE]["engines"]["current"] == str(version)  # type: ignore[index]
            and v[SECOND_VOICE]["engine_versions"] == [str(version)],
            "the derived voice's version 2 on every worker",
        )
    finally:
        stop.set()
        asker.join()
    assert failures == []
    assert after[VOICE]["engines"] == before["engines"]  # no reload, no rejection, same version
    assert after[VOICE]["engine_versions"] == ["1"]
    assert after[SECOND_VOICE]["engines"]["reloads"] == {"ok": 1}  # type: ignore[index]
    swapped = server.synth("After the swap.", voice=SECOND_VOICE)
    assert swapped.headers["x-engine-version"] == str(version)


def test_a_voice_mounted_while_serving_is_picked_up(server: Server, root: Path) -> None:
    name = "en_GB-mounted-low"
    staging = root / f".{name}"
    shutil.copytree(root / SECOND_VOICE / "1", staging / "1")
    staging.rename(root / name)  # one rename: the watcher sees the whole voice at once
    wait_voices(server, lambda v: name in v and v[name]["state"] == "serving",
                "the mounted voice serving")  # fmt: skip
    response = server.synth("A new voice.", voice=name, stream=False)
    assert response.status_code == 200, response.text
    assert response.headers["x-sample-rate"] == str(SECOND_SAMPLE_RATE)


def test_a_worker_over_its_memory_budget_lets_go_of_the_least_used_voice(root: Path) -> None:
    srv = Server(root, "--workers", "1", "--voice-memory-mb", "1")  # below one voice: one held
    try:
        srv.wait_ready(1)
        mounted = {p.name for p in root.iterdir() if not p.name.startswith(".")}
        wait_voices(srv, lambda v: set(v) == mounted
                    and all(e["state"] == "serving" for e in v.values()),
                    "every voice serving")  # fmt: skip
        (pid,) = srv.worker_pids()
        expected = reference(root, VOICE)
        order = [VOICE, SECOND_VOICE, VOICE]
        for voice in order:
            response = srv.client.post("/synthesize", json={
                "text": TEXT, "voice": voice, "stream": False, **DET})  # fmt: skip
            assert response.status_code == 200, response.text
            held = wait_voices(srv, lambda v, want=voice: v[want]["loaded_on"] == [0],
                               f"{voice} held")  # fmt: skip
            others = [name for name, entry in held.items() if entry["loaded_on"]]
            assert others == [voice]  # the one just used, alone
        _, samples = pcm(response)
        assert samples.shape == expected.shape  # loaded again, and still the same voice
        assert np.max(np.abs(samples.astype(np.int32) - expected)) <= 33
        assert srv.worker_pids() == [pid]  # loads and evictions within the one process
        lines = srv.log_lines()
        assert sum('"voice_evicted"' in line for line in lines) >= len(order) - 1
        assert any('"voice_loaded"' in line and SECOND_VOICE in line for line in lines)
        # a script in both voices, on a worker that holds one: the one it found waits with the
        # job while the other loads (and evicts it), then both speak; no endless reloading
        both = srv.client.post("/synthesize", json={
            "text": f'<speak>Hello. <voice name="{SECOND_VOICE}">Good day.</voice> Bye.</speak>',
            "voice": VOICE, "stream": False, **DET}, timeout=120)  # fmt: skip
        assert both.status_code == 200, both.text
        assert pcm(both)[0] == 22050
    finally:
        srv.stop()


def test_a_multi_speaker_voice_takes_a_speaker_by_name_or_id(
    multi_speaker_version: EngineVersion,
    multi_speaker_synth: Synthesizer,
    default_version: EngineVersion,
    tmp_path: Path,
) -> None:
    root = tmp_path / "engines"
    shutil.copytree(default_version.path, root / VOICE / "1")
    shutil.copytree(multi_speaker_version.path, root / multi_speaker_version.voice / "1")
    name = multi_speaker_version.voice
    srv = Server(root, "--workers", "1")
    try:
        srv.wait_ready(1)
        listed = wait_voices(srv, lambda v: v.get(name, {}).get("state") == "serving",
                             "the multi-speaker voice serving")[name]  # fmt: skip
        assert listed["num_speakers"] == 3
        assert listed["speakers"] == list(SPEAKERS)  # names in id order
        by_name = srv.synth(TEXT, voice=name, speaker="ember", stream=False, **DET)
        by_id = srv.synth(TEXT, voice=name, speaker=1, stream=False, **DET)
        first = srv.synth(TEXT, voice=name, stream=False, **DET)
        params = SynthesisParams(noise_scale=0.0, noise_w=0.0, speaker=1)
        expected = multi_speaker_synth.synthesize(TEXT, params)
        _, ember = pcm(by_name)
        assert ember.shape == expected.shape
        assert np.max(np.abs(ember.astype(np.int32) - expected)) <= 33
        assert by_id.content == by_name.content
        assert pcm(first)[1].shape != ember.shape  # speaker 0 speaks at another pace
        unknown = srv.synth("Hello.", voice=name, speaker="nobody")
        assert unknown.status_code == 422
        assert unknown.json()["field"] == "speaker" and "ember" in unknown.json()["error"]
        single = srv.synth("Hello.", voice=VOICE, speaker=2)  # one speaker: id 0 only
        assert single.status_code == 422 and single.json()["field"] == "speaker"
        assert srv.synth("Hello.", voice=VOICE, speaker=0).status_code == 200
    finally:
        srv.stop()
