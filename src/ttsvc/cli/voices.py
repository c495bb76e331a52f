"""``ttsvc voices``: Piper voices by their catalogue name (``pull``, ``sync``, ``list``).

``sync`` is ``pull`` kept up to date with a names file (the chart's per-pod sidecar follows a
mounted ConfigMap with it): every voice listed and not yet published is pulled, again whenever
the file changes, and a failed pull is tried again after ``--retry-s``. A name with a version
is never pulled again: ``sync`` adds voices, it does not update them.

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
    import threading

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
    sync = actions.add_parser(
        "sync", formatter_class=HelpFormatter,
        help="pull the voices a names file lists, again whenever it changes (a sidecar)",
    )  # fmt: skip
    sync.add_argument("names_file", type=Path, metavar="NAMES_FILE",
                      help="voice names, one a line; its directory is watched (a ConfigMap "
                           "mount's updates are a rename there)")  # fmt: skip
    sync.add_argument("--retry-s", type=_positive_seconds, default=60.0,
                      help="a voice that failed to pull is tried again after this long (> 0)",
                      )  # fmt: skip
    sync.add_argument("--base-url", default=None, help=base_help)
    sync.add_argument("--engines-dir", type=Path, default=None, help="engine repository root")
    document_defaults(sync)
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


def _positive_seconds(text: str) -> float:
    """``--retry-s``: a number of seconds above 0 (0 would retry a failed pull without pause)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"{text!r}: must be more than 0 seconds")
    return value


def cmd_voices(args: argparse.Namespace, settings: Settings) -> int:
    from ttsvc.repository.catalogue import FetchError, base_url, client, fetch_catalogue  # noqa: PLC0415

    if args.voices_action == "list" and not args.available:
        return cmd_engines(args, settings)
    if args.voices_action == "pull":
        return pull_names(args.names, args.base_url, args.force, settings)
    if args.voices_action == "sync":
        return _sync(args.names_file, args.base_url, args.retry_s, settings)
    _quiet_httpx()
    try:
        with client() as http:
            catalogue = fetch_catalogue(http, base_url(args.base_url))
    except FetchError as exc:
        print(f"ttsvc voices: {exc}", file=sys.stderr)
        return 1
    _say_skipped(catalogue.skipped)
    for v in catalogue.listing(args.language or ""):
        print(
            f"{v.name:40} {v.language.code:8} {v.quality:8} "
            f"{v.num_speakers:4} speaker{'s' if v.num_speakers != 1 else ''}"
        )
    return 0


def _quiet_httpx() -> None:
    """Each download is named in the progress lines: httpx's own request lines are noise."""
    logging.getLogger("httpx").setLevel(logging.WARNING)


def pull_names(names: list[str], base: str | None, force: bool, settings: Settings) -> int:
    """``voices pull NAMES``: 0 when each is published (or was), 2 for a name that is not a
    voice name or not in the catalogue (nothing written), 1 when a pull failed."""
    from ttsvc.repository.catalogue import (  # noqa: PLC0415
        FetchError,
        UnknownCatalogueVoice,
        base_url,
        client,
        fetch_catalogue,
    )

    for name in names:  # a name is a directory in the engines directory: no path
        problem = name_problem(name)
        if problem is not None:
            print(f"ttsvc voices: {problem}", file=sys.stderr)
            return USAGE_ERROR
    _quiet_httpx()
    try:
        with client() as http:
            catalogue = fetch_catalogue(http, base_url(base))
            try:
                found = [catalogue.find(name).name for name in names]
            except UnknownCatalogueVoice as exc:
                print(f"ttsvc voices: {exc}", file=sys.stderr)
                return USAGE_ERROR
            failed = sum(_pull(catalogue, name, force, settings, http) for name in found)
    except FetchError as exc:
        print(f"ttsvc voices: {exc}", file=sys.stderr)
        return 1
    return 1 if failed else 0


def _sync(names_file: Path, base: str | None, retry_s: float, settings: Settings) -> int:
    """``voices sync``: pull what ``names_file`` lists and is not published, at start, on each
    change of the file's directory, and every ``retry_s`` while a pull has failed; until SIGTERM
    (a container's PID 1 ignores it unless handled), which ends the loop after the pull
    underway (the names after it are left for the next start)."""
    import signal  # noqa: PLC0415
    import threading  # noqa: PLC0415

    from watchfiles import watch  # noqa: PLC0415

    from ttsvc.repository.layout import EngineRepository  # noqa: PLC0415

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    repo = EngineRepository(settings.engines_dir)
    listed: list[str] | None = None
    missing = True
    changes = watch(names_file.parent, stop_event=stop, yield_on_timeout=True,
                    rust_timeout=max(1, int(retry_s * 1000)), debounce=50)  # fmt: skip
    while not stop.is_set():
        names = _read_names(names_file)
        if names != listed:
            print(f"ttsvc voices sync: {names_file} lists {' '.join(names) or 'no voice'}",
                  flush=True)  # fmt: skip
            listed, missing = names, True
        if missing:
            wanted = [n for n in names if name_problem(n) is None and repo.latest(n) is None]
            for bad in (n for n in names if name_problem(n) is not None):
                print(f"ttsvc voices sync: {name_problem(bad)}; skipped", file=sys.stderr)
            missing = _sync_round(wanted, base, settings, stop)
            if stop.is_set():
                break
            state = f"retrying in {retry_s:g} s" if missing else "every voice listed is published"
            print(f"ttsvc voices sync: {state}", flush=True)
        if next(changes, None) is None:
            break
    return 0


def _sync_round(
    names: list[str], base: str | None, settings: Settings, stop: threading.Event
) -> bool:
    """One round of ``voices sync``: the catalogue fetched once, then each name pulled on its
    own, so that whatever fails for one name (not in the catalogue, a refused compile, an
    unwritable volume) is said in one line and the others are pulled all the same; SIGTERM
    (``stop``) is heeded between names. True when a name is still missing."""
    from ttsvc.repository.catalogue import base_url, client, fetch_catalogue  # noqa: PLC0415

    if not names:
        return False
    _quiet_httpx()
    missing = False
    try:
        with client() as http:
            catalogue = fetch_catalogue(http, base_url(base))
            _say_skipped(catalogue.skipped)
            for name in names:
                if stop.is_set():
                    return True
                try:
                    missing |= _pull(catalogue, catalogue.find(name).name, False, settings, http)
                except Exception as exc:  # one name's failure, whatever it is
                    print(f"ttsvc voices: {name}: {_one_line(exc)}; nothing published",
                          file=sys.stderr)  # fmt: skip
                    missing = True
    except Exception as exc:  # the catalogue unreachable or refused, ...
        print(f"ttsvc voices: {_one_line(exc)}", file=sys.stderr)
        return True
    return missing


def _one_line(exc: Exception) -> str:
    """``exc`` as one line: its own words where it is one of ours, else its type and words."""
    from ttsvc.repository.catalogue import FetchError  # noqa: PLC0415

    if isinstance(exc, TTSError):
        said = exc.message
    elif isinstance(exc, FetchError):
        said = str(exc)
    else:
        said = f"{type(exc).__name__}: {exc}"
    return " ".join(said.split())


def _read_names(path: Path) -> list[str]:
    """The voice names in ``path``, one a line (blank lines and ``#`` comments aside); none
    while it is missing."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [line.strip() for line in text.splitlines()
            if line.strip() and not line.strip().startswith("#")]  # fmt: skip


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
