"""``ttsvc voices`` as a user runs it: a real subprocess against a loopback catalogue mirror.

The good pull compiles for real (10 to 30 s), once for the module, and once more into the
engines directory of a running ``ttsvc serve``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engine_files import VOICE
from tests.gateway.serving import Server
from tests.voice_mirror import (
    MODEL_PATH,
    TEST_VOICE,
    Mirror,
    hostile_files,
    mirror_files,
    serve_mirror,
)
from ttsvc.backends.loader import load_engine_set
from ttsvc.repository.layout import EngineRepository, EngineVersion


def _pull(mirror: Mirror, root: Path, *names: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``ttsvc voices pull NAMES`` from the loopback mirror into the engines directory ``root``."""
    return _ttsvc("voices", "pull", *(names or (TEST_VOICE,)), "--base-url", mirror.base,
                  "--engines-dir", str(root), cwd=cwd)  # fmt: skip


def _ttsvc(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "TTSVC_VOICES_URL"} | (env or {})
    return subprocess.run(
        [sys.executable, "-m", "ttsvc.cli", *args],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def mirror() -> Iterator[Mirror]:
    with serve_mirror(Mirror(mirror_files())) as served:
        yield served


@pytest.fixture(scope="module")
def pulled(
    mirror: Mirror, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """A fresh engines directory after ``ttsvc voices pull`` of the test voice."""
    root = tmp_path_factory.mktemp("pulled") / "engines"
    result = _pull(mirror, root, cwd=root.parent)
    return root, result


def test_pull_publishes_a_voice_that_loads(
    pulled: tuple[Path, subprocess.CompletedProcess[str]], mirror: Mirror
) -> None:
    root, result = pulled
    assert result.returncode == 0, result.stderr
    latest = EngineRepository(root).latest(TEST_VOICE)
    assert isinstance(latest, EngineVersion)
    load_engine_set(latest.path)
    assert f"published {TEST_VOICE} version 1" in result.stdout
    assert "ttsvc voices: " in result.stderr and f"{mirror.base}/{MODEL_PATH}" in result.stderr
    assert "step 1/" in result.stderr  # the compile's own progress
    assert [p.name for p in root.iterdir()] == [TEST_VOICE]  # no download directory left


def test_pull_skips_a_published_voice_unless_forced(
    pulled: tuple[Path, subprocess.CompletedProcess[str]], mirror: Mirror
) -> None:
    root, _ = pulled
    result = _ttsvc(
        "voices",
        "pull",
        TEST_VOICE,
        "--engines-dir",
        str(root),
        cwd=root.parent,
        env={"TTSVC_VOICES_URL": mirror.base},
    )
    assert result.returncode == 0, result.stderr
    assert "already published (version 1); skipped (--force" in result.stderr
    assert [v.version for v in EngineRepository(root).versions(TEST_VOICE)] == [1]


def test_a_voice_pulled_while_serving_answers_right_after_it_is_published(
    mirror: Mirror, engines_root: Path, tmp_path: Path
) -> None:
    """The pull ends when the voice is renamed into place (``published``); the request sent at
    once is not refused while the service verifies the voice (hashes, copies and stages it,
    its canary on a worker): it waits for it, server-side, and is answered. Then ``/health``
    and ``GET /voices`` name the same ready voices, and the request's completion line names
    the voice it asked for."""
    root = tmp_path / "engines"
    shutil.copytree(engines_root, root)
    # a bound no shared CI machine reaches: this test is about waiting, not about its bound
    server = Server(root, "--workers", "1", "--voice-wait", "120")
    try:
        server.wait_ready(1)
        result = _pull(mirror, root, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert f"published {TEST_VOICE} version 1" in result.stdout
        response = server.synth("Pulled a moment ago.", voice=TEST_VOICE, stream=False)
        assert response.status_code == 200, response.text
        ready = server.client.get("/health").json()["voices"]
        states = {v["name"]: v["state"] for v in server.client.get("/voices").json()["voices"]}
        assert ready == [VOICE, TEST_VOICE]
        assert [name for name, state in states.items() if state == "serving"] == ready
        lines = [c for c in server.completions() if c["uid"] == response.headers["x-request-id"]]
        assert [(line["voice"], line["code"]) for line in lines] == [(TEST_VOICE, 200)]
    finally:
        server.stop()


def test_list_without_available_is_engines_ls(
    pulled: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    root, _ = pulled
    result = _ttsvc("voices", "list", "--engines-dir", str(root), cwd=root.parent)
    assert result.returncode == 0, result.stderr
    engines = _ttsvc("engines", "ls", "--engines-dir", str(root), cwd=root.parent)
    assert result.stdout == engines.stdout and f"* {TEST_VOICE} v1 ort" in result.stdout


def test_list_available_reads_the_catalogue(mirror: Mirror, tmp_path: Path) -> None:
    result = _ttsvc("voices", "list", "--available", "--base-url", mirror.base, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[:3] for line in lines] == [
        ["de_DE-thorsten-high", "de_DE", "high"],
        [TEST_VOICE, "en_US", "medium"],
    ]
    assert lines[1].endswith("1 speaker")
    result = _ttsvc(
        "voices",
        "list",
        "--available",
        "--language",
        "de",
        cwd=tmp_path,
        env={"TTSVC_VOICES_URL": mirror.base},
    )
    assert [line.split()[0] for line in result.stdout.splitlines()] == ["de_DE-thorsten-high"]


def test_unknown_name_is_exit_2_with_near_matches(mirror: Mirror, tmp_path: Path) -> None:
    root = tmp_path / "engines"
    result = _pull(mirror, root, TEST_VOICE, "en_US-testvoice-mediun", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"ttsvc voices: en_US-testvoice-mediun: no such voice in {mirror.base}/voices.json; "
        f"did you mean {TEST_VOICE}?"
    ]
    assert not root.exists()  # nothing written, not even the known voice's


def test_failed_pull_is_one_line_and_exit_1(mirror: Mirror, tmp_path: Path) -> None:
    root = tmp_path / "engines"
    mirror.cut.add(MODEL_PATH)
    try:
        result = _pull(mirror, root, cwd=tmp_path)
    finally:
        mirror.cut.discard(MODEL_PATH)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ttsvc voices: {TEST_VOICE}: download of ") and "cut short" in last
    assert last.endswith("nothing published")
    assert EngineRepository(root).voices() == [] and list(root.iterdir()) == []


def test_unreachable_catalogue(tmp_path: Path) -> None:
    result = _ttsvc(
        "voices", "list", "--available", "--base-url", "http://127.0.0.1:9/x", cwd=tmp_path
    )
    assert result.returncode == 1
    assert result.stderr.startswith("ttsvc voices: catalogue unreachable: http://127.0.0.1:9/x/")


HOSTILE = "../../../rel/pwned-voice"
RULE = ("letters, digits, '.', '_' and '-', starting with a letter or digit, no '..', at most 64 "
        "characters")  # fmt: skip


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def hostile() -> Iterator[Mirror]:
    """A catalogue that also lists the test voice (md5 right) under a path, and under a good
    name whose entry's own ``key`` is a path."""
    files = hostile_files(mirror_files(), HOSTILE)
    files = hostile_files(files, "en_US-decoy-medium", entry_key="../decoy")
    with serve_mirror(Mirror(files)) as served:
        yield served


def test_a_path_asked_for_by_name_is_refused_before_anything(
    hostile: Mirror, tmp_path: Path
) -> None:
    """Before: the catalogue's key was followed as a path, and the voice published at
    ``<engines>/../../../rel/pwned-voice/1``. Now: exit 2, one line, nothing fetched or written,
    whatever the catalogue lists."""
    root = tmp_path / "a" / "b" / "engines"
    (tmp_path / "a" / "rel").mkdir(parents=True)  # where the download landed: it exists
    before = _tree(tmp_path)
    result = _pull(hostile, root, HOSTILE, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"ttsvc voices: '{HOSTILE}' is not a voice name: {RULE}"
    ]
    assert _tree(tmp_path) == before and hostile.requests == []


def test_a_good_name_whose_entry_is_a_path_is_one_line_and_exit_1(
    hostile: Mirror, tmp_path: Path
) -> None:
    root = tmp_path / "a" / "b" / "engines"
    result = _pull(hostile, root, "en_US-decoy-medium", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"ttsvc voices: {hostile.base}/voices.json: entry refused: '../decoy' is not a voice "
        f"name: {RULE}"
    ]
    assert _tree(tmp_path) == [] and hostile.requests == ["voices.json"]


def test_list_available_skips_entries_whose_names_are_paths(
    hostile: Mirror, tmp_path: Path
) -> None:
    result = _ttsvc("voices", "list", "--available", "--base-url", hostile.base, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert [line.split()[0] for line in result.stdout.splitlines()] == [
        "de_DE-thorsten-high",
        TEST_VOICE,
    ]
    (said,) = result.stderr.strip().splitlines()
    assert said.startswith(f"ttsvc voices: skipped {hostile.base}/voices.json: entry refused: ")
    assert said.endswith(" (and 1 more)")


def _sync(names: Path, root: Path, base: str, lines: int, *flags: str) -> tuple[list[str], str]:
    """``ttsvc voices sync NAMES`` as the sidecar runs it: its first ``lines`` lines of stdout,
    then SIGTERM (which must end it with 0), and all it said on stderr (kept in a file: a
    compile's progress lines must not fill a pipe no one reads)."""
    environ = {k: v for k, v in os.environ.items() if k != "TTSVC_VOICES_URL"}
    with (names.parent.parent / "sync.stderr").open("w+") as errors:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ttsvc.cli", "voices", "sync", str(names), *flags,
             "--base-url", base, "--engines-dir", str(root)],
            cwd=names.parent.parent, env=environ, stdout=subprocess.PIPE, stderr=errors,
            text=True,
        )  # fmt: skip
        assert proc.stdout is not None
        try:
            said = [proc.stdout.readline() for _ in range(lines)]
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=120) == 0
        errors.seek(0)
        return said, errors.read()


def test_sync_skips_what_is_not_a_name_and_retries_a_failed_pull(tmp_path: Path) -> None:
    """``voices sync`` (the chart's per-pod sidecar): a line that is not a voice name is said
    and skipped, a pull that fails (the catalogue unreachable) is tried again after
    ``--retry-s`` without a change of the file, and SIGTERM ends it with 0."""
    names = tmp_path / "voices" / "pull"
    names.parent.mkdir()
    names.write_text(f"# the voices ConfigMap\n../escape\n{TEST_VOICE}\n")
    root = tmp_path / "engines"
    said, errors = _sync(names, root, "http://127.0.0.1:9", 3, "--retry-s", "0.2")
    assert said[0] == f"ttsvc voices sync: {names} lists ../escape {TEST_VOICE}\n"
    assert said[1:] == ["ttsvc voices sync: retrying in 0.2 s\n"] * 2  # each after a failure
    assert "'../escape' is not a voice name" in errors and "; skipped" in errors
    assert "127.0.0.1:9" in errors  # the unreachable catalogue, named
    assert not root.exists() or list(root.iterdir()) == []


def test_sync_pulls_the_listed_voices_a_name_the_catalogue_lacks_aside(
    mirror: Mirror, tmp_path: Path
) -> None:
    """One name the catalogue does not have (a typo in the ConfigMap) is retried on its own:
    the voices listed beside it are pulled all the same."""
    names = tmp_path / "voices" / "pull"
    names.parent.mkdir()
    names.write_text(f"en_US-nobody-medium\n{TEST_VOICE}\n")
    root = tmp_path / "engines"
    said, _ = _sync(names, root, mirror.base, 3)
    assert said[0].endswith(f"lists en_US-nobody-medium {TEST_VOICE}\n")
    assert said[1].startswith(f"published {TEST_VOICE} version 1 at ")
    assert said[2] == "ttsvc voices sync: retrying in 60 s\n"
    assert EngineRepository(root).voices() == [TEST_VOICE]


def test_sync_says_a_failure_of_any_kind_in_one_line_and_carries_on(
    mirror: Mirror, tmp_path: Path
) -> None:
    """An engines volume that cannot be written (here a file where its parent should be: an
    OSError, not a fetch or compile error): each name's failure is one line, the next name is
    still tried, and the loop keeps retrying instead of dying with a traceback."""
    names = tmp_path / "voices" / "pull"
    names.parent.mkdir()
    names.write_text(f"{TEST_VOICE}\nen_US-nobody-medium\n")
    (tmp_path / "file").write_text("")
    root = tmp_path / "file" / "engines"
    said, errors = _sync(names, root, mirror.base, 3, "--retry-s", "0.2")
    assert said[0].endswith(f"lists {TEST_VOICE} en_US-nobody-medium\n")
    assert said[1:] == ["ttsvc voices sync: retrying in 0.2 s\n"] * 2
    assert "Traceback" not in errors
    own = f"ttsvc voices: {TEST_VOICE}: "
    failed = [line for line in errors.splitlines() if line.startswith(own)]
    assert failed and all(line.endswith("; nothing published") for line in failed)
    assert "NotADirectoryError: " in failed[0] and str(root) in failed[0]
    assert "en_US-nobody-medium" in errors  # the name after it was tried all the same


def test_sync_round_fetches_the_catalogue_once_and_heeds_sigterm_between_names(
    mirror: Mirror, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process, against the loopback mirror, each pull scripted (``_pull``, which the
    subprocess tests run for real): one round asks for voices.json once however many names it
    pulls, and a SIGTERM (the stop event) during one pull leaves the next names for later."""
    from ttsvc.cli import voices  # noqa: PLC0415
    from ttsvc.config import Settings  # noqa: PLC0415

    pulled: list[str] = []
    stop = threading.Event()
    stop_after: list[int] = []

    def scripted_pull(catalogue: object, name: str, force: bool, settings: Settings,
                      http: object) -> bool:  # fmt: skip
        pulled.append(name)
        if len(pulled) in stop_after:
            stop.set()  # what the SIGTERM handler does, while this pull runs
        return False

    monkeypatch.setattr(voices, "_pull", scripted_pull)
    settings = Settings(engines_dir=tmp_path / "engines")
    asked = len(mirror.requests)
    assert voices._sync_round([TEST_VOICE] * 3, mirror.base, settings, stop) is False
    assert pulled == [TEST_VOICE] * 3
    assert [p for p in mirror.requests[asked:] if p.endswith("voices.json")] == [
        mirror.requests[asked]]  # fmt: skip
    pulled.clear()
    stop_after.append(1)
    assert voices._sync_round([TEST_VOICE] * 3, mirror.base, settings, stop) is True
    assert pulled == [TEST_VOICE]  # the other two wait for the next start


def test_sync_refuses_a_retry_of_zero_seconds(tmp_path: Path) -> None:
    """``--retry-s 0`` would retry a failed pull without pause: refused, exit 2, nothing run."""
    for value in ("0", "-1", "nan"):
        result = _ttsvc("voices", "sync", str(tmp_path / "pull"), "--retry-s", value, cwd=tmp_path)
        assert result.returncode == 2
        assert f"argument --retry-s: {value!r}: must be more than 0 seconds" in result.stderr
