"""``ttsvc keys``: add, list and remove the API keys of the key file.

Its own module because it is the one subcommand that prints a secret (a new key, once, to
stdout): what it prints and what it stores (only the hash) are easier to check in one place.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ttsvc.cli.args import HelpFormatter
from ttsvc.config import Settings


def add_keys(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = sub.add_parser("keys", help="manage API keys: add (prints the key once, stores only "
                          "its hash), list, remove", formatter_class=HelpFormatter)  # fmt: skip
    actions = keys.add_subparsers(dest="action", required=True)

    def file_flag(p: argparse.ArgumentParser) -> None:
        p.add_argument("--file", type=Path, default=None, dest="api_keys_file",
                       help="the key file (default: $TTSVC_API_KEYS_FILE)")

    add = actions.add_parser("add", help="make a key, print it once, store its hash",
                             formatter_class=HelpFormatter)  # fmt: skip
    add.add_argument("name", help="what logs and metrics call requests made with this key")
    file_flag(add)
    add.add_argument("--rpm", type=int, default=None, help="requests per minute (default: none)")
    add.add_argument("--audio-s-per-min", type=float, default=None,
                     help="seconds of audio per minute (default: none)")
    add.add_argument("--streams", type=int, default=None,
                     help="concurrent streams (default: the server's default, a fair share)")
    listing = actions.add_parser("list", help="names and limits of the keys (never a key)",
                                 formatter_class=HelpFormatter)  # fmt: skip
    file_flag(listing)
    remove = actions.add_parser("remove", help="delete a key (a running server drops it at its "
                                "next reload)", formatter_class=HelpFormatter)  # fmt: skip
    remove.add_argument("name", help="the key's name")
    file_flag(remove)


def cmd_keys(args: argparse.Namespace, settings: Settings) -> int:
    from ttsvc.gateway.core.keys import KeyFileError, parse_keys, remove_key  # noqa: PLC0415
    from ttsvc.gateway.core.quotas import Quota  # noqa: PLC0415

    path = settings.api_keys_file
    if path is None:
        print("ttsvc keys: name the key file with --file or TTSVC_API_KEYS_FILE", file=sys.stderr)
        return 2
    try:
        if args.action == "add":
            return _add_key(args, path)
        if args.action == "remove":
            remove_key(path, args.name)
            print(f"removed key {args.name!r} from {path}", file=sys.stderr)
            return 0
        keys = parse_keys(path.read_text(encoding="utf-8"), str(path), Quota())
    except (KeyFileError, OSError) as exc:
        print(f"ttsvc keys: {exc}", file=sys.stderr)
        return 2
    if not keys:
        print(f"no keys in {path}", file=sys.stderr)
    for key in keys:
        q = key.quota
        limits = [f"{label}={value:g}" for label, value in (
            ("rpm", q.requests_per_minute), ("audio_s_per_min", q.audio_s_per_minute),
            ("streams", q.streams)) if value is not None]  # fmt: skip
        # the hash's first hex digits tell two keys apart; the key itself is never stored
        shown = " ".join(limits) or "server defaults"
        print(f"{key.name}\tsha256:{key.digest.hex()[:12]}\t{shown}")
    return 0


def _add_key(args: argparse.Namespace, path: Path) -> int:
    from ttsvc.gateway.core.keys import (  # noqa: PLC0415
        KeyFileError,
        append_key,
        key_line,
        new_key,
        parse_keys,
    )
    from ttsvc.gateway.core.quotas import Quota  # noqa: PLC0415

    if (
        (args.rpm is not None and args.rpm < 1)
        or (args.audio_s_per_min is not None and args.audio_s_per_min <= 0)
        or (args.streams is not None and args.streams < 1)
    ):
        print("ttsvc keys: limits must be positive", file=sys.stderr)
        return 2
    key = new_key()
    line = key_line(args.name, key, Quota(args.rpm, args.audio_s_per_min, args.streams))
    if path.exists():
        names = {k.name for k in parse_keys(path.read_text(encoding="utf-8"), str(path),
                                            Quota())}  # fmt: skip
        if args.name in names:
            raise KeyFileError(f"{path}: a key named {args.name!r} exists already")
    append_key(path, line)
    # the only time the key exists outside its holder: stdout, never a log
    print(key)
    print(f"added key {args.name!r} to {path} (only its sha256 is stored)", file=sys.stderr)
    return 0
