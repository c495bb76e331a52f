"""The `ttsvc` command as a user runs it: a real subprocess."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from ttsvc.audio.wav import read_wav
from ttsvc.cli import build_parser
from ttsvc.cli.args import overrides
from ttsvc.cli.engines import resolve_engines
from ttsvc.config import DEFAULT_VOICE, Settings
from ttsvc.cpus import CpuBudget, cpu_budget, default_split
from ttsvc.errors import Unauthorized
from ttsvc.gateway.core.keys import KeyStore
from ttsvc.gateway.core.quotas import Quota
from ttsvc.memory import cgroup_memory_limit, worker_memory_mb
from ttsvc.repository.layout import EngineVersion


def _ttsvc(
    *args: str, cwd: Path, env: dict[str, str | None] | None = None
) -> subprocess.CompletedProcess[str]:
    """``ttsvc ARGS`` in ``cwd``; ``env`` adds variables to this one's, None removes one."""
    environ = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "ttsvc.cli", *args],
        cwd=cwd, capture_output=True, text=True, timeout=240, check=False,
        env={k: v for k, v in environ.items() if v is not None},
    )  # fmt: skip


def test_synth_writes_wav_and_reports_ttfa_and_rtf(
    default_version: EngineVersion, engines_root: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out.wav"
    result = _ttsvc("synth", "Hello from the command line.", "-o", str(out),
                    "--engines-dir", str(engines_root), cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "first chunk" in result.stdout and "real-time factor" in result.stdout
    pcm, rate = read_wav(out)
    assert rate == 22050
    assert 0.8 < len(pcm) / rate < 5.0


def test_synth_nothing_to_say_is_a_clear_error(engines_root: Path, tmp_path: Path) -> None:
    result = _ttsvc("synth", "🎉🎉", "--engines-dir", str(engines_root), cwd=tmp_path)
    assert result.returncode == 1
    assert "nothing to speak" in result.stderr
    assert "Traceback" not in result.stderr


def test_synth_text_the_voice_cannot_speak_is_a_clear_error(
    engines_root: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out.wav"
    result = _ttsvc("synth", "你好，世界。", "-o", str(out), "--engines-dir", str(engines_root),
                    cwd=tmp_path)  # fmt: skip
    assert result.returncode == 1
    assert "voice en_US-joe-medium speaks English (en-us); the text has Han letters" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr
    assert not out.exists()


@pytest.mark.parametrize("speed,says", [("0", "greater than or equal to 0.25"),
                                        ("9", "less than or equal to 4")])  # fmt: skip
def test_synth_bad_speed_is_one_clear_line(
    engines_root: Path, tmp_path: Path, speed: str, says: str
) -> None:
    """The field and its bound, not pydantic's text (several lines and a link to its docs)."""
    result = _ttsvc("synth", "Hi.", "--speed", speed, "--engines-dir", str(engines_root),
                    cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2
    assert result.stderr == f"ttsvc synth: invalid parameter: speed: Input should be {says}\n"


def test_synth_speaks_with_a_speaker_named_by_the_voice(
    multi_speaker_version: EngineVersion, tmp_path: Path
) -> None:
    root = multi_speaker_version.path.parents[1]
    lengths = []
    for speaker in ("joe", "ember"):
        out = tmp_path / f"{speaker}.wav"
        flags = ["--speaker", speaker, "--noise-scale", "0", "--noise-w", "0",
                 "--engines-dir", str(root), "--voice", multi_speaker_version.voice]  # fmt: skip
        result = _ttsvc("synth", "Hello from the command line.", "-o", str(out), *flags,
                        cwd=tmp_path)  # fmt: skip
        assert result.returncode == 0, result.stderr
        lengths.append(len(read_wav(out)[0]))
    assert lengths[0] != lengths[1]  # speaker 1 of the derived voice speaks at another pace


def test_synth_unknown_speaker_is_a_clear_error(engines_root: Path, tmp_path: Path) -> None:
    result = _ttsvc("synth", "Hi.", "--speaker", "ember", "--engines-dir", str(engines_root),
                    cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2
    assert "speaker" in result.stderr and "single speaker" in result.stderr
    assert "Traceback" not in result.stderr


def test_compile_trt_exits_with_clear_message(tmp_path: Path) -> None:
    result = _ttsvc("compile", "--backend", "trt", "--output-dir", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 1
    assert "TensorRT" in result.stderr and "Traceback" not in result.stderr


def test_engines_ls(default_version: EngineVersion, engines_root: Path, tmp_path: Path) -> None:
    result = _ttsvc("engines", "ls", "--engines-dir", str(engines_root), cwd=tmp_path)
    assert result.returncode == 0
    assert "* en_US-joe-medium v1 ort fp32/fp32 stateful" in result.stdout


def test_engines_copy_of_an_uploaded_version_directory_names_the_manifests_voice(
    default_version: EngineVersion, tmp_path: Path
) -> None:
    """One version directory uploaded as ``upload/v1``: published as the voice its manifest
    names, and the line says the folder's name was not followed."""
    upload = tmp_path / "upload" / "v1"
    shutil.copytree(default_version.path, upload)
    target = tmp_path / "volume"
    result = _ttsvc("engines", "copy", str(upload), "--engines-dir", str(target), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        f"published {default_version.voice} version 1 at {target / default_version.voice / '1'} "
        f"(a copy of {upload}) (the voice its manifest names; its folder says upload)\n"
    )


def test_engines_copy_into_an_unwritable_place_is_one_line_and_exit_1(
    default_version: EngineVersion, tmp_path: Path
) -> None:
    """The engines directory cannot be made (a file where its parent should be): one line
    naming it, exit 1, no traceback."""
    (tmp_path / "file").write_text("")
    target = tmp_path / "file" / "engines"
    result = _ttsvc("engines", "copy", str(default_version.path), "--engines-dir", str(target),
                    cwd=tmp_path)  # fmt: skip
    assert result.returncode == 1
    (said,) = result.stderr.strip().splitlines()
    assert said.startswith(f"ttsvc engines: copying {default_version.path} into {target}: ")
    assert said.endswith("; nothing published")


def test_serve_says_it_binds_loopback_by_default(tmp_path: Path) -> None:
    result = _ttsvc("serve", "--help", cwd=tmp_path)
    assert result.returncode == 0
    assert "default 127.0.0.1" in " ".join(result.stdout.split())


def test_admission_flags_reach_the_settings() -> None:
    args = build_parser().parse_args(["serve", "--default-key-streams", "3", "--max-audio-s",
                                      "120", "--api-docs"])  # fmt: skip
    settings = Settings(**overrides(args))  # type: ignore[arg-type]
    assert settings.default_key_streams == 3 and settings.max_audio_s == 120
    assert settings.api_docs is True
    plain = Settings(**overrides(build_parser().parse_args(["serve"])))  # type: ignore[arg-type]
    assert (plain.host, plain.default_key_streams, plain.api_docs) == ("127.0.0.1", None, False)


def split_settings(*flags: str) -> Settings:
    return Settings(**overrides(build_parser().parse_args(["serve", *flags])))  # type: ignore[arg-type]


def split(*flags: str) -> tuple[int, int]:
    """Worker processes x compute threads of ``ttsvc serve FLAGS`` with this environment."""
    settings = split_settings(*flags)
    return settings.workers, settings.compute_threads


@pytest.fixture
def no_ttsvc_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for key in [k for k in os.environ if k.startswith("TTSVC_")]:
        monkeypatch.delenv(key)
    return monkeypatch


def test_default_split_follows_the_cpus_this_process_may_use(no_ttsvc_env: object) -> None:
    settings = Settings()
    budget = cpu_budget()  # this machine's real cgroup files and affinity mask
    assert settings.cpu_budget() == budget
    assert (settings.workers, settings.compute_threads) == default_split(budget.cpus)
    assert settings.realtime_load == 0.75
    assert settings.step_floor_ms == 50.0
    assert settings.whole_sentences


def test_split_flags_reach_the_settings(no_ttsvc_env: object) -> None:
    assert split("--cpus", "8") == (2, 4)
    assert split_settings("--cpus", "8", "--realtime-load", "0.5").realtime_load == 0.5
    assert split_settings("--step-floor-ms", "40").step_floor_ms == 40.0
    assert not split_settings("--no-whole-sentences").whole_sentences
    assert split_settings("--window-growth", "3").schedule().growth == 3.0
    assert split("--cpus", "8", "--compute-threads", "2") == (4, 2)
    assert split("--cpus", "8", "--workers", "3", "--compute-threads", "1") == (3, 1)
    assert split_settings("--cpus", "8").cpu_budget() == CpuBudget(8, "cpus setting")


def test_explicit_split_wins_flags_over_environment(no_ttsvc_env: pytest.MonkeyPatch) -> None:
    no_ttsvc_env.setenv("TTSVC_CPUS", "8")
    no_ttsvc_env.setenv("TTSVC_WORKERS", "3")
    assert split() == (3, 3)  # the 8 CPUs spread over the 3 processes
    assert split("--workers", "1") == (1, 8)
    no_ttsvc_env.setenv("TTSVC_COMPUTE_THREADS", "2")
    assert split() == (3, 2)
    no_ttsvc_env.delenv("TTSVC_WORKERS")
    assert split() == (4, 2)
    no_ttsvc_env.delenv("TTSVC_COMPUTE_THREADS")
    assert split() == (2, 4)


@pytest.mark.parametrize(
    "flags",
    [["--workers", "0"], ["--compute-threads", "0"], ["--cpus", "0"], ["--workers", "257"],
     ["--realtime-load", "0"]],
)
def test_bad_split_is_refused(flags: list[str], tmp_path: Path) -> None:
    result = _ttsvc("serve", *flags, cwd=tmp_path)
    assert result.returncode == 2
    assert "invalid settings" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.splitlines()) == 1 and "errors.pydantic.dev" not in result.stderr


def test_an_engines_dir_that_is_a_file_is_one_clear_line(tmp_path: Path) -> None:
    (tmp_path / "engines").write_text("")
    result = _ttsvc("serve", "--engines-dir", str(tmp_path / "engines"), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"ttsvc: invalid settings: engines_dir: {tmp_path / 'engines'} is a file, not a "
        "directory (the engines directory holds a directory per voice)"]


def _subcommands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[
    tuple[tuple[str, ...], argparse.ArgumentParser]
]:
    """Every (sub)command's words and parser, the top level included."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _subcommands(child, (*path, name))


def _help_entries(text: str) -> dict[str, str]:
    """Each option's help from ``--help`` output, keyed by its first option string."""
    entries: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        if re.match(r"^  -", line):
            current = line.split()[0].rstrip(",")
            entries[current] = line
        elif current is not None and line.startswith("    "):
            entries[current] += " " + line.strip()
        else:
            current = None
    return {name: " ".join(entry.split()) for name, entry in entries.items()}


def test_every_flag_of_every_subcommand_has_help_with_its_default(tmp_path: Path) -> None:
    commands = list(_subcommands(build_parser()))
    assert {words for words, _ in commands} >= {
        (), ("compile",), ("synth",), ("serve",), ("keys",), ("keys", "add"), ("keys", "list"),
        ("keys", "remove"), ("engines",),
    }
    for words, parser in commands:
        result = _ttsvc(*words, "--help", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        entries = _help_entries(result.stdout)
        own = (argparse._HelpAction, argparse._VersionAction)
        flags = [a for a in parser._actions if a.option_strings and not isinstance(a, own)]
        assert len(flags) == len(entries) - 1 - (words == ()), (words, entries)
        for action in flags:
            entry = entries[action.option_strings[0]]
            described = entry.split(None, 1 + (action.nargs != 0))[-1]
            assert re.search(r"\bdefault[: ]", described), f"ttsvc {' '.join(words)}: {entry}"
        for action in parser._actions:  # positionals need no default, but help
            if not action.option_strings and not isinstance(action, argparse._SubParsersAction):
                assert action.help, f"ttsvc {' '.join(words)} {action.dest}"


def test_version(tmp_path: Path) -> None:
    result = _ttsvc("--version", cwd=tmp_path)
    assert result.returncode == 0
    project = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    version = re.search(r'^version = "(.+)"', project, re.MULTILINE)
    assert version is not None and result.stdout.split() == ["ttsvc", version.group(1)]
    as_module = subprocess.run([sys.executable, "-m", "ttsvc", "--version"], cwd=tmp_path,
                               capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert as_module.returncode == 0 and as_module.stdout == result.stdout  # python -m ttsvc


def test_keys_list_and_remove(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    env = {"TTSVC_API_KEYS_FILE": str(path)}
    added = {name: _ttsvc("keys", "add", name, *flags, cwd=tmp_path, env=env)
             for name, flags in (("ci", ["--rpm", "5"]), ("web", []))}  # fmt: skip
    assert all(r.returncode == 0 for r in added.values()), added
    path.write_text("# rotated monthly\n" + path.read_text())
    listed = _ttsvc("keys", "list", cwd=tmp_path, env=env)
    assert listed.returncode == 0, listed.stderr
    rows = [line.split("\t") for line in listed.stdout.splitlines()]
    assert [(r[0], r[2]) for r in rows] == [("ci", "rpm=5"), ("web", "server defaults")]
    assert all(r.stdout.strip() not in listed.stdout for r in added.values())  # never a key

    removed = _ttsvc("keys", "remove", "ci", "--file", str(path), cwd=tmp_path)
    assert removed.returncode == 0, removed.stderr
    assert path.read_text().startswith("# rotated monthly\nweb ")
    store = KeyStore(path, Quota())
    store.load()
    assert store.authenticate(f"Bearer {added['web'].stdout.strip()}").name == "web"
    with pytest.raises(Unauthorized):
        store.authenticate(f"Bearer {added['ci'].stdout.strip()}")
    again = _ttsvc("keys", "remove", "ci", cwd=tmp_path, env=env)
    assert again.returncode == 2 and "no key named 'ci'" in again.stderr
    assert "Traceback" not in again.stderr


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A real socket listening on a free loopback port: the port is in use."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock


def test_api_port_in_use_is_one_clear_line(listener: socket.socket, tmp_path: Path) -> None:
    port = listener.getsockname()[1]
    empty = tmp_path / "engines"  # nothing compiled: the check comes before any compile
    result = _ttsvc("serve", "--port", str(port), "--metrics-port", "0", "--engines-dir",
                    str(empty), "--log-format", "console", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 1
    message = (f"port {port} on 127.0.0.1 is in use: choose another with --port or "
               "TTSVC_PORT")  # fmt: skip
    assert result.stderr.strip().splitlines() == [f"ttsvc serve: {message}"]
    assert not empty.exists()
    # where the log is JSON (a container's), the reason is one JSON line like every other
    result = _ttsvc("serve", "--port", str(port), "--metrics-port", "0", "--engines-dir",
                    str(empty), "--log-format", "json", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 1 and result.stderr == ""
    (line,) = [json.loads(x) for x in result.stdout.splitlines()]
    assert (line["event"], line["error"], line["level"]) == ("serve_failed", message, "error")


def test_metrics_port_in_use_when_set_is_one_clear_line(
    listener: socket.socket, tmp_path: Path
) -> None:
    port = listener.getsockname()[1]
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        api = str(free.getsockname()[1])  # let go before the server checks it
    for how in (["--metrics-port", str(port)], []):
        env = {} if how else {"TTSVC_METRICS_PORT": str(port)}
        result = _ttsvc("serve", *how, "--port", api, "--engines-dir", str(tmp_path / "e"),
                        "--log-format", "console", cwd=tmp_path, env=env)  # fmt: skip
        assert result.returncode == 1, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and f"port {port} on 127.0.0.1 is in use" in lines[0]
        assert "--metrics-port" in lines[0]


def test_wyoming_port_is_off_by_default_and_must_be_its_own(no_ttsvc_env: object) -> None:
    assert split_settings().wyoming_port == 0
    assert split_settings("--wyoming-port", "10200").wyoming_port == 10200
    for taken in ("9000", "9091"):  # the API's and the metrics' ports
        with pytest.raises(ValueError, match="wyoming_port must differ"):
            split_settings("--wyoming-port", taken)


def test_worker_memory_follows_the_voices_unless_set(no_ttsvc_env: pytest.MonkeyPatch) -> None:
    limit = cgroup_memory_limit()  # this machine's own container limit, if any
    plain = split_settings("--workers", "1")
    assert plain.worker_memory_mb == worker_memory_mb(plain.voice_memory_mb, 1, limit)
    assert split_settings("--worker-memory-mb", "900").worker_memory_mb == 900
    assert split_settings("--worker-memory-mb", "0").worker_memory_mb == 0  # no cap
    no_ttsvc_env.setenv("TTSVC_VOICE_MEMORY_MB", "300")
    assert split_settings("--workers", "1").worker_memory_mb == worker_memory_mb(300, 1, limit)
    with pytest.raises(ValueError, match="worker_memory_mb must be 0"):
        split_settings("--worker-memory-mb", "100")


def test_wyoming_bounds_reach_the_settings(no_ttsvc_env: object) -> None:
    settings = split_settings("--wyoming-host", "10.1.2.3", "--wyoming-allow", "192.168.1.0/24",
                              "--wyoming-allow", "::1", "--wyoming-max-connections", "5")
    assert settings.wyoming_host == "10.1.2.3"
    assert settings.wyoming_allow == ["192.168.1.0/24", "::1"]
    assert settings.wyoming_max_connections == 5
    with pytest.raises(ValueError, match="expected an address or a network"):
        split_settings("--wyoming-allow", "living room")


def test_websocket_bounds_reach_the_settings(no_ttsvc_env: pytest.MonkeyPatch) -> None:
    """Before: WebSocket sessions had neither a cap nor an idle timeout to set."""
    plain = split_settings()
    assert (plain.ws_max_sessions, plain.ws_idle_timeout_s) == (256, 60.0)
    settings = split_settings("--ws-max-sessions", "8", "--ws-idle-timeout", "2.5")
    assert (settings.ws_max_sessions, settings.ws_idle_timeout_s) == (8, 2.5)
    no_ttsvc_env.setenv("TTSVC_WS_IDLE_TIMEOUT_S", "9")
    assert split_settings().ws_idle_timeout_s == 9
    for bad in (["--ws-max-sessions", "0"], ["--ws-idle-timeout", "0"]):
        with pytest.raises(ValueError):
            split_settings(*bad)


def test_wyoming_port_in_use_is_one_clear_line(listener: socket.socket, tmp_path: Path) -> None:
    port = listener.getsockname()[1]
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        api = str(free.getsockname()[1])  # let go before the server checks it
    empty = tmp_path / "engines"
    result = _ttsvc("serve", "--port", api, "--metrics-port", "0", "--wyoming-port", str(port),
                    "--engines-dir", str(empty), "--log-format", "console",
                    cwd=tmp_path)  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"ttsvc serve: port {port} on 127.0.0.1 is in use: choose another with --wyoming-port or "
        "TTSVC_WYOMING_PORT (0: off)"
    ]
    assert not empty.exists()  # refused before any compile


def test_default_engines_dir_is_the_same_from_any_directory(
    default_version: EngineVersion, engines_root: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(engines_root, cache / "ttsvc" / "engines")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env: dict[str, str | None] = {"XDG_CACHE_HOME": str(cache), "TTSVC_ENGINES_DIR": None,
                                  "TTSVC_COMPILE_DEFAULT_VOICE": "false"}  # fmt: skip
    result = _ttsvc("synth", "Found from anywhere.", "-o", "hi.wav", cwd=elsewhere, env=env)
    assert result.returncode == 0, result.stderr
    assert (elsewhere / "hi.wav").is_file() and not (elsewhere / "engines").exists()
    listed = _ttsvc("engines", "ls", cwd=tmp_path, env=env)
    assert "* en_US-joe-medium v1" in listed.stdout


@pytest.mark.slow
def test_compile_prints_numbered_steps_and_an_estimate_first(tmp_path: Path) -> None:
    """Context engines: their context measurement is the long silent step, estimated first
    (stateful engines have none: their check takes seconds)."""
    result = _ttsvc("compile", "--output-dir", str(tmp_path / "engines"), "--split-at",
                    "decoder", "--streaming", "context", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stderr.strip().splitlines()
    assert all(line.startswith("ttsvc compile: ") for line in lines), lines  # no JSON
    steps = [re.search(r"step (\d+)/(\d+): (.*)", line) for line in lines]
    numbered = [(int(m[1]), int(m[2]), m[3]) for m in steps if m]
    assert [n for n, _, _ in numbered] == list(range(1, numbered[0][1] + 1))
    estimate = next(i for i, line in enumerate(lines) if "print nothing until done" in line)
    calibrate = next(i for i, line in enumerate(lines) if "frame context (about" in line)
    assert estimate < calibrate
    assert re.search(r"about \d+ s on this machine", lines[estimate])
    assert result.stdout.startswith("published en_US-joe-medium version 1")


def test_the_first_start_compile_logs_its_steps_under_a_named_event(
    tmp_path: Path, no_ttsvc_env: pytest.MonkeyPatch
) -> None:
    """Loki and Grafana filter on ``event``: the first start's compile steps were all
    ``"event": "default"``, which says nothing (issue 28)."""
    settings = Settings(engines_dir=tmp_path / "engines")
    with structlog.testing.capture_logs() as logs:
        path = resolve_engines(settings, DEFAULT_VOICE)
    assert (path / "manifest.json").is_file()
    assert {entry["event"] for entry in logs} == {"compile_default_voice"}
    assert any(entry["detail"].startswith("step 1/") for entry in logs)


def test_top_level_help_speaks_to_users_and_defaults_show_once() -> None:
    """``ttsvc --help`` showed the module's developer docstring, and --cors-origin printed
    its default twice (issue 28)."""
    top = _ttsvc("--help", cwd=Path.cwd())
    assert top.returncode == 0 and "``" not in top.stdout
    assert "Streaming text-to-speech" in top.stdout
    serve = " ".join(_ttsvc("serve", "--help", cwd=Path.cwd()).stdout.split())
    cors = serve[serve.index("--cors-origin CORS_ORIGINS allow"):]
    assert cors[: cors.index("; env")].count("default") == 1
    assert "--scheduler" not in serve and "--no-multiplex" not in serve  # one scheduler
