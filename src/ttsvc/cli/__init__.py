"""The ``ttsvc`` command: compile engines, synthesize from the command line, list engines.

Settings are built here, once, from the environment and flags, and passed down.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ttsvc import __version__
from ttsvc.cli.args import HelpFormatter, invalid, overrides
from ttsvc.cli.compile import add_compile, cmd_compile
from ttsvc.cli.engines import add_engines, cmd_engines
from ttsvc.cli.keys import add_keys, cmd_keys
from ttsvc.cli.serve import add_serve, cmd_serve
from ttsvc.cli.synth import add_synth, cmd_synth
from ttsvc.cli.voices import add_voices, cmd_voices
from ttsvc.config import Settings
from ttsvc.errors import TTSError
from ttsvc.observability.logs import capture_stray_output, configure_logging, get_logger

# ``DESCRIPTION`` is the top-level --help; each subcommand's flags and command are in its
# own module (compile, synth, serve, keys, engines), the shared argument helpers in args

DESCRIPTION = (
    "Streaming text-to-speech: serve it over HTTP, WebSocket and Wyoming (serve), compile "
    "Piper voices into engines (compile), synthesize to a WAV file (synth), manage API keys "
    "(keys) and engine versions (engines), pull Piper's catalogue voices by name (voices). "
    "Every setting flag also reads a TTSVC_* environment variable."
)
"""What ``ttsvc --help`` says: for the person at the prompt (the module docstring is for
developers)."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and docs)."""
    parser = argparse.ArgumentParser(prog="ttsvc", description=DESCRIPTION,
                                     formatter_class=HelpFormatter)  # fmt: skip
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_compile(sub)
    add_synth(sub)
    add_serve(sub)
    add_keys(sub)
    add_engines(sub)
    add_voices(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ttsvc`` console script."""
    args = build_parser().parse_args(argv)
    try:
        settings = Settings(**overrides(args))  # type: ignore[arg-type]
    except ValueError as exc:
        print(f"ttsvc: invalid settings: {invalid(exc)}", file=sys.stderr)
        return 2
    # the service's logs are its output (stdout, for Loki); other commands keep stdout for results
    serving = args.command == "serve"
    chosen = configure_logging(settings.log_level, sys.stdout if serving else None,
                               settings.log_format)  # fmt: skip
    if serving and chosen == "json":
        capture_stray_output()  # a traceback or a warning must not break Loki's JSON lines
    commands = {
        "compile": cmd_compile,
        "synth": cmd_synth,
        "serve": cmd_serve,
        "keys": cmd_keys,
        "engines": cmd_engines,
        "voices": cmd_voices,
    }
    try:
        return commands[args.command](args, settings)
    except TTSError as exc:
        if serving and chosen == "json":  # a log collector reads JSON lines: say it in one
            get_logger("serve").error("serve_failed", error=exc.message, type=exc.type)
        else:
            print(f"ttsvc {args.command}: {exc.message}", file=sys.stderr)
        return 1
