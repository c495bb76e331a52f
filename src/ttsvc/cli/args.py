"""Argument helpers shared by every ``ttsvc`` subcommand.

One place for the help format and for the map from flags to ``Settings`` fields, so that each
subcommand's flags document the settings' own defaults the same way and ``main`` turns any of
them into settings overrides.
"""

from __future__ import annotations

import argparse

from pydantic import ValidationError

from ttsvc.config import Settings


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's default-showing help, except where the help already says its default or the
    default is None (those flags say in words what their unset value means)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "(default" in text or action.default is None or not action.option_strings:
            return text
        return super()._get_help_string(action)


# flag dest -> Settings field, for the flags that feed the settings
_FLAG_FIELDS = {"engines_dir": "engines_dir", "voice": "voice", "threads": "threads",
                "first_window": "first_window_frames", "output_dir": "engines_dir",
                "alone_first_window": "alone_first_window_frames",
                "host": "host", "port": "port", "workers": "workers",
                "compute_threads": "compute_threads", "cpus": "cpus",
                "realtime_load": "realtime_load", "overload": "overload",
                "step_floor_ms": "step_floor_ms", "window_growth": "window_growth",
                "whole_sentences": "whole_sentences",
                "metrics_port": "metrics_port", "wyoming_port": "wyoming_port",
                "max_streams_per_worker": "max_streams_per_worker",
                "queue_timeout_s": "queue_timeout_s", "drain_grace_s": "drain_grace_s",
                "idle_timeout_s": "idle_timeout_s", "header_timeout_s": "header_timeout_s",
                "body_timeout_s": "body_timeout_s",
                "api_keys_file": "api_keys_file",
                "default_rpm": "default_rpm",
                "default_audio_s_per_min": "default_audio_s_per_min",
                "default_key_streams": "default_key_streams", "max_audio_s": "max_audio_s",
                "api_docs": "api_docs", "log_format": "log_format",
                "cors_origins": "cors_origins", "voice_memory_mb": "voice_memory_mb",
                "worker_memory_mb": "worker_memory_mb", "wyoming_host": "wyoming_host",
                "wyoming_allow": "wyoming_allow",
                "wyoming_max_connections": "wyoming_max_connections",
                "ws_max_sessions": "ws_max_sessions", "ws_idle_timeout_s": "ws_idle_timeout_s",
                "ssml_unknown_elements": "ssml_unknown_elements",
                "lexicons_dir": "lexicons_dir",
                "openai_ssml": "openai_ssml", "voice_wait_s": "voice_wait_s",
                "wyoming_ssml": "wyoming_ssml"}  # fmt: skip


def _settings_default(field: str) -> str | None:
    """What an unset flag of ``field`` falls back to, for its help (None: no fixed value)."""
    from pydantic_core import PydanticUndefined  # noqa: PLC0415

    info = Settings.model_fields[field]
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
    elif info.default is PydanticUndefined or info.default is None:
        return None
    else:
        value = info.default
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def document_defaults(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """Append the settings' own defaults and variable names to the help of flags left unset
    (default None), so help and behaviour cannot drift apart."""
    for action in parser._actions:
        field = _FLAG_FIELDS.get(action.dest)
        if field is None or action.dest in skip or action.default is not None:
            continue
        env = f"TTSVC_{field.upper()}"
        text = action.help or ""
        if "(default" not in text:
            value = _settings_default(field)
            text += f" (default: {value})" if value is not None else " (default: none)"
        action.help = f"{text}; env {env}"


def overrides(args: argparse.Namespace) -> dict[str, object]:
    overrides = {
        field: getattr(args, flag)
        for flag, field in _FLAG_FIELDS.items()
        if getattr(args, flag, None) is not None
    }
    aliases = getattr(args, "voice_aliases", None)
    if aliases:
        overrides["voice_aliases"] = dict(a.partition("=")[::2] for a in aliases)
    return overrides


def invalid(exc: ValueError) -> str:
    """A value error as one line a person reads: ``field: reason`` for each of pydantic's
    errors (its own text spans lines and links to its docs, which say nothing of our flags)."""
    if not isinstance(exc, ValidationError):
        return str(exc)
    return "; ".join(
        f"{'.'.join(str(part) for part in error['loc']) or 'value'}: "
        f"{str(error['msg']).removeprefix('Value error, ')}"
        for error in exc.errors()
    )
