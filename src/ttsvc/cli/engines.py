"""``ttsvc engines``, and finding the engines a voice is served from.

The engine repository as the command line sees it: ``engines ls`` lists it, and
``resolve_engines`` (used by ``synth`` and ``serve``) finds a voice's version in it, compiling
the default voice when it is missing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ttsvc.cli.args import HelpFormatter, document_defaults
from ttsvc.config import DEFAULT_VOICE, Settings
from ttsvc.observability.logs import get_logger


def add_engines(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("engines", help="inspect the engine repository",
                       formatter_class=HelpFormatter)  # fmt: skip
    p.add_argument("action", choices=["ls"], help="ls: voices, versions, checksums")
    p.add_argument("--engines-dir", type=Path, default=None, help="engine repository root")
    document_defaults(p)


def resolve_engines(settings: Settings, voice: str) -> Path:
    """The directory of the version that serves ``voice``, compiling the default if needed."""
    from ttsvc.compile.build import ensure_default_voice  # noqa: PLC0415
    from ttsvc.errors import UnknownVoice  # noqa: PLC0415
    from ttsvc.repository.layout import EngineRepository  # noqa: PLC0415

    repo = EngineRepository(settings.engines_dir)
    latest = repo.latest(voice)
    if latest is None and voice == DEFAULT_VOICE and settings.compile_default_voice:
        log = get_logger("engines")
        latest = ensure_default_voice(settings.engines_dir,
                                      lambda m: log.info("compile_default_voice", detail=m))
    if latest is None:
        raise UnknownVoice(f"no engines for voice {voice!r} in {settings.engines_dir}")
    return latest.path


def cmd_engines(args: argparse.Namespace, settings: Settings) -> int:
    from ttsvc.repository.layout import EngineRepository  # noqa: PLC0415
    from ttsvc.repository.manifest import load_manifest  # noqa: PLC0415

    repo = EngineRepository(settings.engines_dir)
    voices = repo.voices()
    if not voices:
        print(f"no engines in {settings.engines_dir}")
    for voice in voices:
        versions = repo.versions(voice)
        for v in versions:
            m = load_manifest(v.path)
            active = "*" if v is versions[-1] else " "
            sums = " ".join(f"{n}:{e.sha256[:12]}" for n, e in sorted(m.files.items()))
            precision = f"{m.precision['acoustic']}/{m.precision['vocoder']}"
            print(f"{active} {voice} v{v.version} {m.backend} {precision} {m.streaming} "
                  f"{m.created_at} {sums}")
    return 0
