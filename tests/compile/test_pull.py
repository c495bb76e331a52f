"""Pulling a catalogue voice fails safely: every fault ends before the compile, with one clear
line, nothing published, the voice's old engines as they were and no download directory left.

The good pull (a real compile) is ``tests/test_cli_voices.py``'s, through the command.
"""

from __future__ import annotations

import errno
import json
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import httpx
import pytest

from tests.voice_mirror import (
    CONFIG_PATH,
    MODEL_PATH,
    TEST_VOICE,
    Mirror,
    mirror_files,
    serve_mirror,
)
from ttsvc.compile import pull
from ttsvc.compile.pull import pull_voice
from ttsvc.repository.catalogue import (
    Catalogue,
    FetchError,
    UnknownCatalogueVoice,
    base_url,
    fetch_catalogue,
)
from ttsvc.repository.manifest import MANIFEST_NAME


@pytest.fixture
def mirror() -> Iterator[Mirror]:
    with serve_mirror(Mirror(mirror_files())) as served:
        yield served


@pytest.fixture
def engines(tmp_path: Path) -> Path:
    """An engines directory whose test voice has a version serving already (a stand-in)."""
    version = tmp_path / "engines" / TEST_VOICE / "1"
    version.mkdir(parents=True)
    (version / MANIFEST_NAME).write_text("{}")
    return tmp_path / "engines"


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _pull_fails(mirror: Mirror, engines: Path) -> str:
    """Pull the test voice, expecting a ``FetchError``; the engines directory must be unchanged
    and the compile never reached."""
    before = _tree(engines)
    with httpx.Client() as client:
        catalogue = fetch_catalogue(client, mirror.base)
        with pytest.raises(FetchError) as failed:
            pull_voice(catalogue, TEST_VOICE, engines, client)
    assert _tree(engines) == before  # the old version untouched, no .pull- directory left
    return str(failed.value)


@pytest.fixture(autouse=True)
def _no_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> None:
        raise AssertionError("a failed download must never reach the compile")

    monkeypatch.setattr(pull, "compile_voice", refuse)


def test_hash_mismatch_is_refused_with_both_digests(mirror: Mirror, engines: Path) -> None:
    model = bytearray(mirror.files[MODEL_PATH])
    model[-1] ^= 0xFF  # same size, other bytes
    mirror.files[MODEL_PATH] = bytes(model)
    message = _pull_fails(mirror, engines)
    assert MODEL_PATH in message and "md5" in message and "refused" in message
    assert message.count("md5") == 1 and len(message.split()) < 30
    catalogue = Catalogue.parse(mirror.base, json.loads(mirror.files["voices.json"]))
    assert catalogue.find(TEST_VOICE).file(".onnx").md5_digest in message


def test_missing_file_names_its_url(mirror: Mirror, engines: Path) -> None:
    mirror.missing.add(CONFIG_PATH)
    message = _pull_fails(mirror, engines)
    assert message == f"HTTP 404 for {mirror.base}/{CONFIG_PATH}"


def test_cut_download_says_so(mirror: Mirror, engines: Path) -> None:
    mirror.cut.add(MODEL_PATH)
    message = _pull_fails(mirror, engines)
    assert "cut short" in message and "connection closed" in message
    assert str(len(mirror.files[MODEL_PATH])) in message


def test_short_file_is_refused_by_size(mirror: Mirror, engines: Path) -> None:
    """A mirror that serves a truncated file honestly (its own Content-Length)."""
    mirror.files[MODEL_PATH] = mirror.files[MODEL_PATH][:1000]
    message = _pull_fails(mirror, engines)
    assert "size 1000 bytes" in message and "cut short" in message


def test_disk_full_says_so(mirror: Mirror, engines: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault injection: the writer raises ENOSPC, as a full filesystem would."""

    def full(out: BinaryIO, chunk: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pull, "_write", full)
    message = _pull_fails(mirror, engines)
    assert message.startswith("disk full writing ")


def test_unknown_name_lists_near_matches(mirror: Mirror) -> None:
    with httpx.Client() as client:
        catalogue = fetch_catalogue(client, mirror.base)
    with pytest.raises(UnknownCatalogueVoice) as unknown:
        catalogue.find("en_US-testvoice-med")
    assert "did you mean en_US-testvoice-medium" in str(unknown.value)
    with pytest.raises(UnknownCatalogueVoice) as unknown:
        catalogue.find("xx")
    assert "did you mean" not in str(unknown.value)


def test_unreachable_catalogue_is_one_line(mirror: Mirror) -> None:
    with httpx.Client() as client, pytest.raises(FetchError) as failed:
        fetch_catalogue(client, "http://127.0.0.1:9/piper-voices")
    assert str(failed.value).startswith("catalogue unreachable: http://127.0.0.1:9/piper-voices/")
    mirror.missing.add("voices.json")
    with httpx.Client() as client, pytest.raises(FetchError) as failed:
        fetch_catalogue(client, mirror.base)
    assert str(failed.value) == f"catalogue unavailable: HTTP 404 for {mirror.base}/voices.json"


def test_catalogue_listing_filters_by_language_prefix(mirror: Mirror) -> None:
    with httpx.Client() as client:
        catalogue = fetch_catalogue(client, mirror.base)
    assert [v.name for v in catalogue.listing()] == ["de_DE-thorsten-high", TEST_VOICE]
    assert [v.name for v in catalogue.listing("en")] == [TEST_VOICE]
    assert [v.name for v in catalogue.listing("de_DE")] == ["de_DE-thorsten-high"]
    assert catalogue.find(TEST_VOICE).file(".onnx.json").path == CONFIG_PATH


def test_base_url_flag_then_environment_then_public(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TTSVC_VOICES_URL", raising=False)
    assert base_url() == "https://huggingface.co/rhasspy/piper-voices/resolve/v1.0.0"
    monkeypatch.setenv("TTSVC_VOICES_URL", "http://mirror.corp/piper/")
    assert base_url() == "http://mirror.corp/piper"
    assert base_url("http://other/") == "http://other"


def test_disk_full_while_compiling_says_so(
    mirror: Mirror, engines: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injection: the compile (which removes its own staging) hits ENOSPC."""

    def full(*_: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pull, "compile_voice", full)
    message = _pull_fails(mirror, engines)
    assert message == f"disk full compiling {TEST_VOICE} in {engines}"
