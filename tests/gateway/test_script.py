"""Text the voice's language cannot speak, on a real server: a 422 naming the language on both
APIs, from the worker that was asked, which goes on serving."""

from __future__ import annotations

from tests.gateway.serving import Server

ENGLISH = "voice en_US-joe-medium speaks English (en-us)"


def test_text_in_a_script_the_voice_cannot_speak_is_a_422_naming_its_language(
    server: Server,
) -> None:
    pids = server.worker_pids()
    chinese = server.client.post("/synthesize", json={"text": "你好，世界。"})
    assert chinese.status_code == 422, chinese.text
    body = chinese.json()
    assert body["type"] == "unsupported_script" and body["field"] == "text"
    assert body["error"].startswith(f"{ENGLISH}; the text has Han letters")

    # one word is enough: espeak-ng would read it out as "Chinese letter"
    mixed = server.synth("Tea is 茶 in Chinese.", stream=False)
    assert mixed.status_code == 422, mixed.text
    assert "Han letters (first '茶' at character 7)" in mixed.json()["error"]

    speech = {"model": "tts-1", "voice": "alloy", "input": "Привет, мир.", "response_format": "wav"}
    openai = server.client.post("/v1/audio/speech", json=speech)
    assert openai.status_code == 422, openai.text
    error = openai.json()["error"]
    assert (error["type"], error["param"]) == ("unsupported_script", "input")
    assert error["message"].startswith(f"{ENGLISH}; the text has Cyrillic letters")

    fine = server.synth("Café naïve Øresund, Dvořák's Straße! 🎉 It costs $5 ✓.")
    assert fine.status_code == 200, fine.text
    assert fine.content[:4] == b"RIFF" and len(fine.content) > 44
    assert server.worker_pids() == pids
    assert "worker_died" not in "\n".join(server.log_lines())
