"""A second Piper voice for tests, derived from the packaged one, since none can be downloaded.

The derived voice is the packaged graph under another name with another config, as a user's
voice would come (``<name>.onnx`` beside ``<name>.onnx.json``): British English, 16000 Hz, "low"
quality, and a 1.3 length scale. Its vocoder makes the same samples as the packaged voice's, but
declared at 16000 Hz they play at that rate and, with the slower length scale, for longer: tests
tell the two voices apart by rate and by length.

Its espeak-ng voice is "en-gb-x-rp", as Piper's en_GB voices name it: "en-gb" is a language code
espeak-ng knows, but not a voice it can set by name (``ttsvc compile`` refuses it in one line).
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

from ttsvc.compile.build import default_checkpoint

SECOND_VOICE = "en_GB-derived-low"
SECOND_SAMPLE_RATE = 16000
SECOND_LENGTH_SCALE = 1.3


def derived_config(packaged: dict[str, object], name: str) -> dict[str, object]:
    """The packaged voice's config with the derived voice's language, rate, quality and speed;
    every other field (phoneme map, Piper version ...) kept, as a user's config has them."""
    config = copy.deepcopy(packaged)
    language = {"code": "en_GB", "family": "en", "region": "GB", "name_native": "English",
                "name_english": "English", "country_english": "United Kingdom"}  # fmt: skip
    inference = config.get("inference")
    assert isinstance(inference, dict)
    config |= {
        "language": language,
        "espeak": {"voice": "en-gb-x-rp"},
        "audio": {"sample_rate": SECOND_SAMPLE_RATE, "quality": "low"},
        "inference": inference | {"length_scale": SECOND_LENGTH_SCALE},
        "dataset": name,
    }
    return config


def derive_checkpoint(dst: Path, name: str = SECOND_VOICE) -> tuple[Path, Path]:
    """Write ``dst/<name>.onnx`` (the packaged graph) and ``dst/<name>.onnx.json`` (the derived
    config); returns both paths, model first, as ``default_checkpoint`` does."""
    model, config = default_checkpoint()
    dst.mkdir(parents=True, exist_ok=True)
    onnx_path = dst / f"{name}.onnx"
    shutil.copyfile(model, onnx_path)
    packaged = json.loads(config.read_text(encoding="utf-8"))
    config_path = dst / f"{name}.onnx.json"
    config_path.write_text(
        json.dumps(derived_config(packaged, name), ensure_ascii=False, indent=2) + "\n",
        encoding="utf-8",
    )
    return onnx_path, config_path
