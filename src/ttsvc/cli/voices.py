"""``ttsvc voices``: Piper voices by their catalogue name (``pull``, ``list``).

Its own module so the compiler and the HTTP client stay behind the imports inside the commands:
building the parser loads neither. ``list`` without ``--available`` is ``engines ls``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ttsvc.cli.args import HelpFormatter, document_defaults
from ttsvc.cli.engines import cmd_engines
from ttsvc.config import Settings
from ttsvc.errors import TTSError
from ttsvc.voice import name_problem

if TYPE_CHECKING:
    import httpx

    from ttsvc.repository.catalogue import Catalogue

USAGE_ERROR = 2
"""An unknown voice name, or one that is not a voice name at all: nothing written (argparse's
own code for bad use)."""


def add_voices(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("voices", help="pull Piper voices by catalogue name; list them",
                       formatter_class=HelpFormatter)  # fmt: skip
    actions = p.add_subparsers(dest="voices_action", required=True)
    base_help = ("the voice repository's base URL, holding voices.json (a mirror inside your "
                 "network); default: $TTSVC_VOICES_URL, else rhasspy/piper-voices v1.0.0 on "
                 "Hugging Face")  # fmt: skip
    pull = actions.add_parser("pull", help="download, check, compile and publish voices",
                              formatter_class=HelpFormatter)  # fmt: skip
    pull.add_argument("names", nargs="+", metavar="NAME", help="e.g. en_GB-alba-medium")
    pull.add_argument("--force", action="store_true",
                      help="pull a voice again though the engines directory has it")  # fmt: skip
    pull.add_argument("--base-url", default=None, help=base_help)
    pull.add_argument("--engines-dir", type=Path, default=None, help="engine repository root")
    document_defaults(pull)
    listing = actions.add_parser("list", help="voices in the engines directory, or --available",
                                 formatter_class=HelpFormatter)  # fmt: skip
    listing.add_argument(
        "--available",
        action="store_true",
        help="list the catalogue's voices instead of the engines directory's",
    )
    listing.add_argument(
        "--language",
        default=None,
        help="with --available: language codes starting with this, en or en_GB (default: all)",
    )
    listing.add_argument("--base-url", default=None, help=base_help)
    listing.add_argument("--engines-dir", type=Path, default=None, help="engine repository root")
    document_defaults(listing)


def cmd_voices(args: argparse.Namespace, settings: Settings) -> int:
    from ttsvc.repository.catalogue import (  # noqa: PLC0415
        FetchError,
        UnknownCatalogueVoice,
        base_url,
        client,
        fetch_catalogue,
    )

    if args.voices_action == "list" and not args.available:
        return cmd_engines(args, settings)
    if args.voices_action == "pull":  # a name is a directory in the engines directory: no path
        for name in args.names:
            problem = name_problem(name)
            if problem is not None:
                print(f"ttsvc voices: {problem}", file=sys.stderr)
                return USAGE_ERROR
    # each download is named in the progress lines: httpx's own request lines are noise here
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        with client() as http:
            catalogue = fetch_catalogue(http, base_url(args.base_url))
            if args.voices_action == "list":
                _say_skipped(catalogue.skipped)
                for v in catalogue.listing(args.language or ""):
                    print(
                        f"{v.name:40} {v.language.code:8} {v.quality:8} "
                        f"{v.num_speakers:4} speaker{'s' if v.num_speakers != 1 else ''}"
                    )
                return 0
            try:
                names = [catalogue.find(name).name for name in args.names]
            except UnknownCatalogueVoice as exc:
                print(f"ttsvc voices: {exc}", file=sys.stderr)
                return USAGE_ERROR
            failed = sum(_pull(catalogue, name, args.force, settings, http) for name in names)
    except FetchError as exc:
        print(f"ttsvc voices: {exc}", file=sys.stderr)
        return 1
    return 1 if failed else 0


def _say_skipped(skipped: list[str]) -> None:
    """The catalogue's entries set aside (names that are paths, ...), in one line."""
    if skipped:
        more = f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""
        print(f"ttsvc voices: skipped {skipped[0]}{more}", file=sys.stderr)


def _pull(
    catalogue: Catalogue, name: str, force: bool, settings: Settings, http: httpx.Client
) -> bool:
    """Pull one voice; True when it failed (said on stderr, the old engines still serving)."""
    from ttsvc.cli.compile import progress_printer  # noqa: PLC0415
    from ttsvc.compile.pull import pull_voice  # noqa: PLC0415
    from ttsvc.repository.catalogue import FetchError  # noqa: PLC0415
    from ttsvc.repository.layout import EngineRepository  # noqa: PLC0415

    existing = EngineRepository(settings.engines_dir).latest(name)
    if existing is not None and not force:
        print(f"ttsvc voices: {name} is already published (version {existing.version}); "
              "skipped (--force pulls it again)", file=sys.stderr)  # fmt: skip
        return False
    started = time.perf_counter()
    try:
        published = pull_voice(
            catalogue,
            name,
            settings.engines_dir,
            http,
            progress_printer(started, "voices"),
            settings.schedule(),
        )
    except FetchError as exc:
        print(f"ttsvc voices: {name}: {exc}; nothing published", file=sys.stderr)
        return True
    except TTSError as exc:  # the compile refused the files (not a Piper voice, ...)
        print(f"ttsvc voices: {name}: {exc.message}; nothing published", file=sys.stderr)
        return True
    print(f"published {published.voice} version {published.version} at {published.path} "
          f"in {time.perf_counter() - started:.1f} s")  # fmt: skip
    return False
