"""``ttsvc engines``, and finding the engines a voice is served from.

The engine repository as the command line sees it: ``engines ls`` lists it, ``engines copy``
publishes versions made elsewhere into it (the chart's seeding of a volume from the image, an
operator's build), and
``resolve_engines`` (used by ``synth`` and ``serve``) finds a voice's version in it, compiling
the default voice when it is missing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ttsvc.cli.args import HelpFormatter, document_defaults
from ttsvc.config import DEFAULT_VOICE, Settings
from ttsvc.observability.logs import get_logger

if TYPE_CHECKING:
    from ttsvc.repository.layout import EngineRepository


def add_engines(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("engines", help="inspect the engine repository",
                       formatter_class=HelpFormatter)  # fmt: skip
    p.add_argument("action", choices=["ls", "copy"],
                   help="ls: voices, versions, checksums; copy: publish SOURCE's serving "
                        "versions here (staging, manifest check, one rename)")  # fmt: skip
    p.add_argument("source", nargs="?", type=Path, default=None,
                   help="copy: an engine repository (each voice's serving version is copied) "
                        "or one version directory; a voice whose files are here already is "
                        "skipped")  # fmt: skip
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

    if getattr(args, "action", "ls") == "copy":
        return _copy(args.source, EngineRepository(settings.engines_dir))

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


def _copy(source: Path | None, target: EngineRepository) -> int:
    """``engines copy``: each voice's serving version in ``source`` (or ``source`` itself, a
    version directory) published into ``target``; 1 when there is nothing to copy."""
    from ttsvc.repository.layout import EngineRepository  # noqa: PLC0415
    from ttsvc.repository.manifest import MANIFEST_NAME, load_manifest  # noqa: PLC0415

    if source is None:
        print("ttsvc engines: copy needs a SOURCE (an engine repository or a version directory)",
              file=sys.stderr)  # fmt: skip
        return 2
    if (source / MANIFEST_NAME).is_file():
        versions = [source]
    else:
        repo = EngineRepository(source)
        versions = [latest.path for v in repo.voices() if (latest := repo.latest(v)) is not None]
    if not versions:
        print(f"ttsvc engines: no engine version in {source}: nothing copied", file=sys.stderr)
        return 1
    for path in versions:
        try:
            voice = load_manifest(path).voice
            published = target.copy_version(path)
        except OSError as exc:  # the volume unwritable, full, gone: one line, like the others
            print(f"ttsvc engines: copying {path} into {target.root}: {exc}; nothing published",
                  file=sys.stderr)  # fmt: skip
            return 1
        folder = path.parent.name  # a version directory's voice folder, unless uploaded alone
        named = "" if folder == voice else (
            f" (the voice its manifest names; its folder says {folder})")  # fmt: skip
        if published is None:
            print(f"{voice}: a version with the same files is in {target.root}; skipped{named}")
        else:
            print(f"published {published.voice} version {published.version} at "
                  f"{published.path} (a copy of {path}){named}")  # fmt: skip
    return 0
