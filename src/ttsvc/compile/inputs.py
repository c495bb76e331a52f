"""What a compile takes, checked before any heavy step: its options, the checkpoint, the config.

``CompileOptions`` is every flag of ``ttsvc compile``; the functions here refuse a config that
is not a Piper voice's, a graph that is not a Piper graph, and a graph and config that do not
belong together, each in one line naming the file and the field, instead of a traceback a
minute into the compile. Every step module imports its options from here (none imports the
orchestration in ``build.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import onnx
from pydantic import ValidationError

from ttsvc.backends.base import SPEAKER_INPUT
from ttsvc.compile.split import SplitPoint
from ttsvc.errors import GraphShapeError, InvalidParameter, VoiceConfigError
from ttsvc.text.phonemize import BOS, EOS, PAD, phonemize
from ttsvc.voice import VoiceConfig
from ttsvc.windows import WindowSchedule

Precision = Literal["fp32", "fp16", "int8"]
Backend = Literal["ort", "trt"]
Streaming = Literal["stateful", "context"]


@dataclass(frozen=True)
class CompileOptions:
    """Everything `ttsvc compile` takes; flags are named like the seed's tool."""

    checkpoint: Path
    config: Path
    output_dir: Path
    voice: str
    quantize: Precision = "fp32"
    max_batch: int = 1
    seq_len: int = 512
    backend: Backend = "ort"
    split_at: SplitPoint = "flow"
    streaming: Streaming = "stateful"
    """``stateful``: frame engines that carry their state between a stream's calls
    (``compile/stateful.py``); ``context``: windows that recompute a context each side (kept
    for comparison, and what a voice the transform cannot convert exactly falls back to)."""
    min_snr_db: float = 30.0
    schedule: WindowSchedule = field(default_factory=WindowSchedule)
    """The serving window schedule: TensorRT profiles are sized to the windows it makes."""
    log: Callable[[str], None] = field(default=lambda _msg: None)


PIPER_INPUTS = ("input", "input_lengths", "scales")
"""Inputs every Piper graph takes (multi-speaker ones add ``sid``)."""


def read_voice_config(path: Path) -> tuple[dict[str, object], VoiceConfig]:
    """A user's Piper config, raw (kept verbatim as ``voice.json``) and parsed.

    Checked before anything is built, so a config that is not a Piper voice's fails in one line
    naming the file and the field, instead of a traceback a minute into the compile.
    """
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise VoiceConfigError(f"{path}: not a readable JSON file: {exc}") from exc
    if not isinstance(raw, dict):
        raise VoiceConfigError(f"{path}: not a JSON object")
    id_map = raw.get("phoneme_id_map")
    if not isinstance(id_map, dict) or not id_map:
        raise VoiceConfigError(
            f"{path}: no phoneme_id_map, so not a Piper voice config (it maps each phoneme to "
            "the graph's input ids)",
            field="phoneme_id_map",
        )
    missing = [symbol for symbol in (PAD, BOS, EOS) if symbol not in id_map]
    if missing:
        raise VoiceConfigError(f"{path}: phoneme_id_map lacks Piper's {' '.join(missing)} "
                               "symbol(s)", field="phoneme_id_map")  # fmt: skip
    try:
        voice = VoiceConfig.from_piper(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise VoiceConfigError(f"{path}: {where}: {first['msg']}", field=where) from exc
    try:
        phonemize("test", voice.espeak_voice)
    except RuntimeError as exc:
        raise VoiceConfigError(f"{path}: espeak.voice {voice.espeak_voice!r} is not a voice "
                               "espeak-ng can set (British English, for one, is 'en-gb-x-rp')",
                               field="espeak.voice") from exc  # fmt: skip
    return raw, voice


def load_piper_graph(path: Path) -> onnx.ModelProto:
    """The checkpoint's graph, refused in one line when it is not ONNX or lacks Piper's inputs."""
    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as exc:
        raise GraphShapeError(f"{path}: not a valid ONNX model: {exc}".strip()) from exc
    model = onnx.load(str(path))
    names = {value.name for value in model.graph.input}
    missing = [name for name in PIPER_INPUTS if name not in names]
    if missing:
        raise GraphShapeError(f"{path}: not a Piper voice graph: no input(s) {', '.join(missing)} "
                              f"(it has {', '.join(sorted(names)) or 'none'})")  # fmt: skip
    return model


def check_speaker_map(voice: VoiceConfig) -> None:
    """Refuse a config whose speaker names point outside its speakers (a 422 later otherwise,
    for a name the voice advertises)."""
    bad = {n: i for n, i in voice.speaker_id_map.items() if not 0 <= i < voice.num_speakers}
    if bad:
        raise GraphShapeError(f"speaker_id_map names ids outside 0..{voice.num_speakers - 1} "
                              f"(num_speakers): {bad}")  # fmt: skip


def check_speakers(model: onnx.ModelProto, voice: VoiceConfig, opts: CompileOptions) -> None:
    """The graph takes a speaker id exactly when the config says it has several speakers."""
    takes_sid = any(i.name == SPEAKER_INPUT for i in model.graph.input)
    if takes_sid != (voice.num_speakers > 1):
        raise GraphShapeError(
            f"{opts.checkpoint.name} {'takes a' if takes_sid else 'has no'} speaker id input "
            f"({SPEAKER_INPUT!r}) but {opts.config.name} says num_speakers "
            f"{voice.num_speakers}: the graph and its config do not belong together"
        )
    if takes_sid and opts.backend == "trt":
        from ttsvc.backends.tensorrt import MULTI_SPEAKER_UNSUPPORTED  # noqa: PLC0415

        raise InvalidParameter(f"{opts.checkpoint.name} has {voice.num_speakers} speakers: "
                               f"{MULTI_SPEAKER_UNSUPPORTED}", field="backend")  # fmt: skip
