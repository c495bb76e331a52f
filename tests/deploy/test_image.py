"""The Dockerfile, without a Docker engine (none runs on these machines or in CI).

The cheap tests read the Dockerfile for what the deployment relies on. The slow one replays the
cpu image's build here: the files its COPY lines bring, its ``install.sh`` steps in a fresh
virtualenv, then its ENTRYPOINT/CMD with its ENV, ready by its HEALTHCHECK, stopped by SIGTERM.
What it cannot show: the base images' own contents (system libraries, the CUDA runtime), the
non-root user and the read-only root filesystem; docs/deploy.md says so.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from ttsvc.config import DEFAULT_VOICE, Settings

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
READY_POLLS = 600  # each poll: one healthcheck run, then up to 0.1 s blocked on the server


@dataclass
class Stage:
    """One ``FROM ... AS name`` stage: its instructions in order, as (KEYWORD, arguments)."""

    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def last(self, keyword: str) -> str:
        found = self.all(keyword)
        assert found, f"stage {self.name} has no {keyword}"
        return found[-1]

    def env(self) -> dict[str, str]:
        pairs = [p for args in self.all("ENV") for p in shlex.split(args)]
        return dict(p.split("=", 1) for p in pairs)


def stages(text: str) -> list[Stage]:
    """The Dockerfile's stages. Comments (parser directives too) and blank lines are dropped and
    continuation lines joined, as BuildKit does; this Dockerfile uses no heredocs."""
    result: list[Stage] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        pending = ""
        keyword, args = keyword.upper(), " ".join(args.split())
        if keyword == "FROM":
            base, _, name = args.partition(" AS ")
            result.append(Stage(name.strip(), base.strip()))
        elif result:
            result[-1].instructions.append((keyword, args))
    return result


def exec_form(args: str) -> list[str]:
    """The JSON array of an exec-form instruction; shell form (no signals to PID 1) fails."""
    parsed = json.loads(args)
    assert isinstance(parsed, list) and all(isinstance(a, str) for a in parsed), args
    return parsed


@pytest.fixture(scope="module")
def targets() -> dict[str, Stage]:
    return {s.name: s for s in stages(DOCKERFILE.read_text())}


def test_cpu_is_the_default_target(targets: dict[str, Stage]) -> None:
    assert list(targets)[-1] == "cpu"  # `docker build .` builds the last stage
    assert "gpu" in targets
    assert "cuda" in targets["gpu"].base.lower() or "CUDA" in targets["gpu"].base


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_runtime_properties(targets: dict[str, Stage], target: str) -> None:
    stage = targets[target]
    settings = Settings()
    user = stage.last("USER").split(":")[0]
    assert user not in ("root", "0") and user.isdigit()  # numeric: runAsNonRoot can verify it
    exposed = {int(p) for args in stage.all("EXPOSE") for p in args.split()}
    assert {settings.port, settings.metrics_port} <= exposed

    healthcheck = stage.last("HEALTHCHECK")
    _options, _, command = healthcheck.partition(" CMD ")
    assert exec_form(command)[-1] == "/opt/ttsvc/healthcheck.py"
    assert any(a.endswith("docker/healthcheck.py /opt/ttsvc/healthcheck.py")
               for a in stage.all("COPY"))  # fmt: skip
    assert exec_form(stage.last("ENTRYPOINT")) == ["ttsvc"]
    assert exec_form(stage.last("CMD")) == ["serve"]

    env = stage.env()
    assert {k for k in env if k.startswith("TTSVC_")} <= {
        f"TTSVC_{f.upper()}" for f in Settings.model_fields
    }
    assert env["TTSVC_ENGINE_CACHE_DIR"].startswith("/tmp/")  # the only writable path
    assert env["TTSVC_COMPILE_DEFAULT_VOICE"] == "false"  # never write under the engines dir
    # where the chart's seed copies the image's engines from (values: engines.imagePath)
    chart_values = yaml.safe_load((ROOT / "helm" / "ttsvc" / "values.yaml").read_text())
    assert env["TTSVC_ENGINES_DIR"] == chart_values["engines"]["imagePath"]
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    # a bare `ttsvc serve` binds loopback; a container must listen where it is published
    assert env["TTSVC_HOST"] == "0.0.0.0" != settings.host


@pytest.mark.parametrize("target", ["build", "gpu"])
def test_dependency_layers_come_before_source_layers(targets: dict[str, Stage],
                                                     target: str) -> None:  # fmt: skip
    steps = targets[target].instructions
    deps = next(i for i, (kw, a) in enumerate(steps) if kw == "RUN" and "install.sh deps" in a)
    source = next(i for i, (kw, a) in enumerate(steps) if kw == "COPY" and a.startswith("src "))
    assert deps < source
    assert "src" not in " ".join(a for kw, a in steps[:deps] if kw == "COPY").split()


def test_gpu_image_installs_tensorrt_and_no_torch(targets: dict[str, Stage]) -> None:
    """`install.sh deps gpu` installs the core dependencies plus the `trt` extra."""
    assert "install.sh deps gpu" in " ".join(targets["gpu"].all("RUN"))
    requires = importlib.metadata.requires("ttsvc") or []
    gpu = [r for r in requires if "extra ==" not in r or 'extra == "trt"' in r]
    names = {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in gpu}
    assert {"tensorrt", "cuda-python", "onnxruntime"} <= names
    assert not [n for n in names if "torch" in n]


def test_cpu_image_ships_the_compiled_voice(targets: dict[str, Stage]) -> None:
    build_runs = " ".join(targets["build"].all("RUN"))
    assert "install.sh engines /opt/ttsvc/engines" in build_runs
    copies = targets["cpu"].all("COPY")
    assert "--from=build /opt/ttsvc/engines /opt/ttsvc/engines" in copies


def test_build_context_leaves_out_dev_state() -> None:
    """A checkout's virtualenv and engines would bloat the context; egg-info and bytecode would
    change the source layer's checksum on every local run."""
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".venv", "engines", "**/__pycache__", "**/*.egg-info"} <= ignored
    copied = {
        source
        for stage in stages(DOCKERFILE.read_text())
        for args in stage.all("COPY")
        if not args.startswith("--from")
        for source in args.split()[:-1]
    }
    assert not copied & ignored


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(sys.version_info < (3, 11), reason="install.sh reads pyproject with tomllib")
def test_cpu_image_build_and_run_in_a_fresh_virtualenv(
    targets: dict[str, Stage], tmp_path: Path
) -> None:
    """Replay the cpu image: /opt, /tmp and the build context are mapped under tmp_path."""

    def host(path: str) -> Path:
        return tmp_path / path.lstrip("/")

    venv = host("/opt/venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    env.pop("VIRTUAL_ENV", None)
    env = {k: v for k, v in env.items() if not k.startswith("TTSVC_")}

    build = targets["build"]
    workdir = host(build.last("WORKDIR"))
    workdir.mkdir(parents=True)
    for kw, args in build.instructions:
        if kw == "COPY":  # the build context's files, as the image gets them
            *sources, dest = args.split()
            for source in sources:
                target = workdir / dest / Path(source).name if dest.endswith("/") else (
                    workdir / dest)  # fmt: skip
                if (ROOT / source).is_dir():
                    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
                    shutil.copytree(ROOT / source, target, ignore=ignore)
                else:
                    shutil.copy(ROOT / source, target)
        elif kw == "RUN" and "install.sh" in args:
            for step in args.split("&&"):
                argv = shlex.split(step)
                if argv[:2] == ["sh", "install.sh"]:
                    argv = [str(host(a)) if a.startswith("/") else a for a in argv]
                    subprocess.run(argv, cwd=workdir, env=env, check=True, timeout=600)

    cpu = targets["cpu"]
    image_env = {k: str(host(v)) if v.startswith("/opt/") or v.startswith("/tmp/") else v
                 for k, v in cpu.env().items() if k.startswith("TTSVC_")}  # fmt: skip
    engines = Path(image_env["TTSVC_ENGINES_DIR"])
    built = sorted(str(p.relative_to(engines)) for p in engines.rglob("*"))
    assert f"{DEFAULT_VOICE}/1/manifest.json" in built
    port, metrics_port = _free_port(), _free_port()
    run_env = {**env, **image_env, "TTSVC_HOST": "127.0.0.1", "TTSVC_PORT": str(port),
               "TTSVC_METRICS_PORT": str(metrics_port), "TTSVC_WORKERS": "1"}  # fmt: skip
    healthcheck = [str(venv / "bin" / "python"), str(ROOT / "docker" / "healthcheck.py")]

    def healthy() -> bool:
        run = subprocess.run(healthcheck, env=run_env, capture_output=True, check=False)
        return run.returncode == 0

    assert not healthy()  # nothing listens yet: the check can fail

    command = exec_form(cpu.last("ENTRYPOINT")) + exec_form(cpu.last("CMD"))
    log = (tmp_path / "serve.log").open("w+")
    server = subprocess.Popen(command, env=run_env, stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(READY_POLLS):
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            if healthy():
                break
            try:  # block on the server for a moment instead of sleeping
                server.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                pass
        else:
            raise AssertionError("the HEALTHCHECK never passed")
        server.send_signal(signal.SIGTERM)  # what `docker stop` sends to the exec-form PID 1
        assert server.wait(timeout=60) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        log.close()
    # served from the image's engines without writing there (the chart mounts them read-only)
    assert sorted(str(p.relative_to(engines)) for p in engines.rglob("*")) == built
    # ... and its run-time writes went to /tmp: the engine cache copies workers loaded, a
    # directory per voice of files named by their sha256
    cache = Path(image_env["TTSVC_ENGINE_CACHE_DIR"])
    assert [p.name for p in cache.iterdir()] == ["en_US-joe-medium"]
    cached = [p.name for p in (cache / "en_US-joe-medium").iterdir()]
    assert cached and all(len(name) == 64 for name in cached)
