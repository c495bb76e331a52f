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
    PREFIX,
    TEST_VOICE,
    Mirror,
    hostile_files,
    mirror_files,
    serve_mirror,
)
from ttsvc.compile import pull
from ttsvc.compile.pull import pull_voice
from ttsvc.repository.catalogue import (
    MAX_REDIRECTS,
    Catalogue,
    CatalogueVoice,
    FetchError,
    RedirectRefused,
    UnknownCatalogueVoice,
    base_url,
    client,
    fetch_catalogue,
    redirect_problem,
)
from ttsvc.repository.manifest import MANIFEST_NAME

HOSTILE = "../../../rel/pwned-voice"
"""The catalogue key seen publishing ``<engines>/../../../rel/pwned-voice/1``."""


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
    with client() as http:
        catalogue = fetch_catalogue(http, mirror.base)
        with pytest.raises(FetchError) as failed:
            pull_voice(catalogue, TEST_VOICE, engines, http)
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


@pytest.fixture
def other() -> Iterator[Mirror]:
    """A second mirror: another origin (another port of 127.0.0.1)."""
    with serve_mirror(Mirror(mirror_files())) as served:
        yield served


def test_hostile_key_asked_for_by_name_writes_nothing_anywhere(
    mirror: Mirror, tmp_path: Path
) -> None:
    """Before: the entry was found, its files (the md5 right) downloaded to
    ``<engines>/.pull-*/../../../rel/pwned-voice.onnx`` and compiled into
    ``<engines>/../../../rel/pwned-voice/1``. Now the entry is set aside when the catalogue is
    read, and asking for it says why."""
    engines = tmp_path / "a" / "b" / "engines"
    (tmp_path / "a" / "rel").mkdir(parents=True)  # where the download landed: it exists
    mirror.files = hostile_files(mirror.files, HOSTILE)
    before = _tree(tmp_path)
    with client() as http:
        catalogue = fetch_catalogue(http, mirror.base)
        with pytest.raises(FetchError) as refused:
            pull_voice(catalogue, HOSTILE, engines, http)
    assert _tree(tmp_path) == before
    assert str(refused.value) == (
        f"{mirror.base}/voices.json: entry refused: '{HOSTILE}' is not a voice name: letters, "
        "digits, '.', '_' and '-', starting with a letter or digit, no '..', at most 64 "
        "characters"
    )
    assert mirror.requests == ["voices.json"]  # not one file of it fetched


def test_entries_whose_names_are_paths_are_set_aside(mirror: Mirror) -> None:
    """Under a path key, or a good key whose entry's own ``key`` is a path (the name a pull
    publishes), or asked for by an alias: never listed, never found, each said once."""
    files = hostile_files(mirror.files, HOSTILE)
    files = hostile_files(files, "en_US-decoy-medium", entry_key="../decoy", aliases=("decoy",))
    catalogue = Catalogue.parse(mirror.base, json.loads(files["voices.json"]))
    assert [v.name for v in catalogue.listing()] == ["de_DE-thorsten-high", TEST_VOICE]
    for name in (HOSTILE, "en_US-decoy-medium", "../decoy", "decoy"):
        with pytest.raises(FetchError) as refused:
            catalogue.find(name)
        assert not isinstance(refused.value, UnknownCatalogueVoice)
        assert "entry refused" in str(refused.value)
    assert "'../decoy' is not a voice name" in str(refused.value)
    assert len(catalogue.skipped) == 2
    with pytest.raises(UnknownCatalogueVoice) as unknown:  # never offered as a near name
        catalogue.find("en_US-decoy-mediun")
    assert str(unknown.value).endswith(f"did you mean {TEST_VOICE}?")


def test_pull_refuses_a_path_name_the_catalogue_let_through(mirror: Mirror, tmp_path: Path) -> None:
    """Defense in depth: a ``Catalogue`` built without ``parse``'s check still writes nothing
    (the download's own file name is the voice's)."""
    entry = json.loads(mirror.files["voices.json"])[TEST_VOICE] | {"key": HOSTILE}
    catalogue = Catalogue(mirror.base, {"x": CatalogueVoice.model_validate(entry)})
    engines = tmp_path / "a" / "b" / "engines"
    with client() as http, pytest.raises(FetchError, match=r"is not a voice name.*: refused$"):
        pull_voice(catalogue, "x", engines, http)
    assert _tree(tmp_path) == [] and mirror.requests == []


def test_redirect_to_another_origin_over_http_is_refused(
    mirror: Mirror, other: Mirror, engines: Path
) -> None:
    """Before: followed to any host, in the clear. Now neither the catalogue nor a file
    follows it, and the other host is never asked."""
    mirror.redirects[MODEL_PATH] = f"{other.base}/{MODEL_PATH}"
    message = _pull_fails(mirror, engines)
    assert message == (
        f"redirect from {mirror.base}/{MODEL_PATH} to {other.base}/{MODEL_PATH} refused: a "
        f"redirect is followed only to https or within {mirror.base.split(PREFIX[:-1])[0]}"
    )
    mirror.redirects["voices.json"] = f"{other.base}/voices.json"
    with client() as http, pytest.raises(RedirectRefused, match="refused: a redirect is"):
        fetch_catalogue(http, mirror.base)
    assert other.requests == []


def test_redirect_within_the_origin_is_followed(
    mirror: Mirror, engines: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled: list[Path] = []
    monkeypatch.setattr(pull, "compile_voice", lambda opts: compiled.append(opts.checkpoint))
    mirror.files["moved.onnx"] = mirror.files[MODEL_PATH]
    mirror.redirects[MODEL_PATH] = f"{PREFIX}moved.onnx"  # a path: the same origin
    with client() as http:
        pull_voice(fetch_catalogue(http, mirror.base), TEST_VOICE, engines, http)
    assert len(compiled) == 1 and mirror.requests[-2:] == ["moved.onnx", CONFIG_PATH]


def test_a_redirect_loop_ends_after_the_limit(mirror: Mirror, engines: Path) -> None:
    mirror.redirects[MODEL_PATH] = f"{PREFIX}{MODEL_PATH}"
    message = _pull_fails(mirror, engines)
    assert message == f"{mirror.base}/{MODEL_PATH}: more than {MAX_REDIRECTS} redirects: refused"
    assert mirror.requests.count(MODEL_PATH) == MAX_REDIRECTS + 1


@pytest.mark.parametrize(
    ("source", "target", "followed"),
    [
        ("https://huggingface.co/a", "https://cdn-lfs.hf.co/b", True),  # Hugging Face's own
        ("http://mirror.corp/a", "https://cdn.example/b", True),  # up to https: anywhere
        ("http://mirror.corp/a", "http://mirror.corp/b", True),
        ("http://mirror.corp:80/a", "http://mirror.corp/b", True),  # the same port, spelled out
        ("http://mirror.corp/a", "http://mirror.corp:8080/b", False),
        ("http://mirror.corp/a", "http://evil.example/b", False),
        ("https://mirror.corp/a", "http://mirror.corp/b", False),  # down to plain http
    ],
)
def test_redirect_rule(source: str, target: str, followed: bool) -> None:
    assert (redirect_problem(httpx.URL(source), httpx.URL(target)) is None) is followed
