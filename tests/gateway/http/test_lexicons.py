"""Pronunciation lexicons on a real `ttsvc serve`: a PLS file in the engines directory's
``lexicons/`` applies to the next request after it changes (written elsewhere and renamed in,
as a ConfigMap update does), a broken one is refused and logged while the old one serves, and a
stream running across the change loses nothing."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.serving import HEALTH_POLLS, Server
from ttsvc.config import DEFAULT_VOICE
from ttsvc.repository.layout import EngineVersion

STILL = {"noise_scale": 0.0, "noise_w": 0.0, "format": "pcm"}
HEAD = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<lexicon version="1.0" '
    'xmlns="http://www.w3.org/2005/01/pronunciation-lexicon" alphabet="ipa" '
    'xml:lang="en-US">\n'
)


def pls(*lexemes: str) -> str:
    return HEAD + "".join(f"  <lexeme>{x}</lexeme>\n" for x in lexemes) + "</lexicon>\n"


@pytest.fixture(scope="module")
def root(default_version: EngineVersion, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An engines directory of its own: its lexicons apply to every request of its server."""
    root = tmp_path_factory.mktemp("lexicon-engines")
    shutil.copytree(default_version.path.parent, root / DEFAULT_VOICE)
    (root / "lexicons").mkdir()
    (root / "lexicons" / "brands.pls").write_text(
        pls("<grapheme>Zork</grapheme><alias>big bad dragon</alias>"), encoding="utf-8"
    )
    return root


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[Server]:
    srv = Server(root, "--workers", "1", env={"TTSVC_WATCH_SETTLE_S": "0.2"})
    srv.wait_ready(1)
    yield srv
    srv.stop()


def publish(root: Path, name: str, content: str) -> None:
    """Write beside, then rename into place: the file is never seen half-written."""
    staged = root / "lexicons" / f".{name}.tmp"
    staged.write_text(content, encoding="utf-8")
    staged.replace(root / "lexicons" / name)


def wait_for(server: Server, ready: object) -> dict[str, object]:
    """``GET /lexicons`` once ``ready(answer)`` holds (the reload it waits for has happened)."""
    for _ in range(HEALTH_POLLS):
        answer = server.client.get("/lexicons").json()
        if ready(answer):  # type: ignore[operator]
            return answer  # type: ignore[no-any-return]
        try:  # block on the server process a moment instead of sleeping
            server.proc.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            pass
    raise AssertionError("the lexicons never changed")


def length(server: Server, text: str, **kw: object) -> int:
    r = server.synth(text, **STILL, **kw)
    assert r.status_code == 200, r.text
    return len(r.content)


def test_lexicons_are_listed_and_applied(server: Server) -> None:
    (brands,) = server.client.get("/lexicons").json()["lexicons"]
    assert brands["name"] == "brands" and brands["lang"] == "en-US" and brands["lexemes"] == 1
    # the alias is longer than the word: the audio says it
    assert length(server, "Zork.") > length(server, "Zork.", lexicons=[]) * 1.5


def test_an_unknown_lexicon_is_a_422(server: Server) -> None:
    r = server.synth("Hi.", lexicons=["nope"])
    assert r.status_code == 422 and r.json()["type"] == "unknown_lexicon"
    r = server.synth("Hi.", lexicons=["../brands"])
    assert r.status_code == 422 and r.json()["field"].startswith("lexicons")


def test_an_edit_takes_effect_and_a_broken_file_is_refused(root: Path, server: Server) -> None:
    before = length(server, "Zork.")
    long_text = "This sentence keeps the stream running while the file changes. " * 6
    with httpx.stream("POST", f"{server.url}/synthesize", json={"text": long_text, **STILL},
                      timeout=60) as running:  # fmt: skip
        pieces = running.iter_bytes()
        first = next(pieces)  # in flight across the change
        sha = server.client.get("/lexicons").json()["lexicons"][0]["sha256"]
        publish(root, "brands.pls", pls("<grapheme>Zork</grapheme><alias>Z</alias>"))
        wait_for(server, lambda a: a["lexicons"][0]["sha256"] != sha)
        rest = b"".join(pieces)
    assert running.status_code == 200
    whole = length(server, long_text)
    assert len(first) + len(rest) == whole  # nothing of the running stream was lost
    assert length(server, "Zork.") < before
    shortened = length(server, "Zork.")

    publish(root, "brands.pls", "<lexicon><lexeme>")
    answer = wait_for(server, lambda a: a["refused"])
    (refusal,) = answer["refused"]  # type: ignore[misc]
    assert refusal["file"] == "brands.pls" and refusal["line"] == 1
    assert length(server, "Zork.") == shortened  # the last good one still serves
    assert any(e.get("event") == "lexicon_refused" and e.get("file") == "brands.pls"
               for e in server.events())  # fmt: skip


def test_a_configmap_directory_of_its_own_is_read(
    default_version: EngineVersion, tmp_path: Path
) -> None:
    """The chart's layout: the lexicons in a ConfigMap volume apart from the engines, each file
    a link through ``..data`` to a timestamped directory, trusted as their own root."""
    engines = tmp_path / "engines"
    shutil.copytree(default_version.path.parent, engines / DEFAULT_VOICE)
    volume = tmp_path / "configmap"
    (volume / "..2026_12_03_13_00_00.1").mkdir(parents=True)
    (volume / "..2026_12_03_13_00_00.1" / "brands.pls").write_text(
        pls("<grapheme>Zork</grapheme><alias>big bad dragon</alias>"), encoding="utf-8")
    (volume / "..data").symlink_to("..2026_12_03_13_00_00.1")
    (volume / "brands.pls").symlink_to("..data/brands.pls")
    srv = Server(engines, "--workers", "1", "--lexicons-dir", str(volume))
    try:
        srv.wait_ready(1)
        answer = srv.client.get("/lexicons").json()
        assert [x["name"] for x in answer["lexicons"]] == ["brands"], answer
        assert answer["refused"] == []
    finally:
        srv.stop()
