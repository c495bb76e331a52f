"""`ttsvc compile --checkpoint` on a voice other than the packaged one: the derived second voice
(tests/voices.py), compiled by the real CLI in ``second_voice_root``, and checkpoints that are
not Piper voices, refused in one line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.voices import (
    SECOND_LENGTH_SCALE,
    SECOND_SAMPLE_RATE,
    SECOND_VOICE,
    derive_checkpoint,
    derived_config,
)
from ttsvc.backends.loader import load_engine_set
from ttsvc.compile.build import default_checkpoint
from ttsvc.config import DEFAULT_VOICE
from ttsvc.repository.layout import EngineRepository
from ttsvc.repository.manifest import load_manifest
from ttsvc.synthesis import SynthesisParams, Synthesizer
from ttsvc.voice import VOICE_FILE

# the first test to ask for ``second_voice_root`` may compile both voices on a busy machine
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TEXT = "Is this the right way to the station?"
QUIET = SynthesisParams(noise_scale=0.0, noise_w=0.0)


def _ttsvc(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TTSVC_")}
    return subprocess.run(
        [sys.executable, "-m", "ttsvc.cli", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


def _packaged_config() -> dict[str, object]:
    data = json.loads(default_checkpoint()[1].read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def test_published_under_its_name_at_version_1_with_its_config(second_voice_root: Path) -> None:
    repo = EngineRepository(second_voice_root)
    assert repo.voices() == sorted([DEFAULT_VOICE, SECOND_VOICE])
    versions = repo.versions(SECOND_VOICE)
    assert [v.version for v in versions] == [1]
    path = versions[0].path
    voice_json = json.loads((path / VOICE_FILE).read_text(encoding="utf-8"))
    assert voice_json == derived_config(_packaged_config(), SECOND_VOICE)
    manifest = load_manifest(path)
    assert manifest.voice == SECOND_VOICE
    assert manifest.sample_rate == SECOND_SAMPLE_RATE
    assert manifest.hop_length == 256  # measured from the graph: the packaged vocoder's
    assert manifest.source["checkpoint"] == f"{SECOND_VOICE}.onnx"


def test_speaks_at_its_rate_and_its_length_scale(
    second_voice_root: Path, synth: Synthesizer
) -> None:
    derived = Synthesizer(load_engine_set(EngineRepository(second_voice_root).latest(
        SECOND_VOICE).path))  # type: ignore[union-attr]  # fmt: skip
    assert derived.sample_rate == SECOND_SAMPLE_RATE
    assert synth.sample_rate == 22050

    # each voice's own front end (en-gb-x-rp and en-us phonemes) and own config: longer audio
    ours, theirs = derived.synthesize(TEXT, QUIET), synth.synthesize(TEXT, QUIET)
    assert len(ours) > 1.15 * len(theirs), (len(ours), len(theirs))

    # the same phoneme ids isolate the length scale (same graph): the derived voice's audio is
    # the default voice's slowed by 1.3 (frames are rounded up per phoneme, so their ratio is
    # not 1.3 itself). A speed is relative to the voice's own rate: above 1 its frames are its
    # speed-1 frames shared out over the speed (compile/speed.py), so speed 1.3 makes the derived
    # voice's audio 1.3x shorter, not the default voice's rounded-up frames again
    ids = synth.sentences(TEXT)[0].ids
    slow, plain = derived.one_shot(ids, QUIET), synth.one_shot(ids, QUIET)
    assert len(slow) > len(plain)
    slowed = synth.one_shot(ids, QUIET.model_copy(update={"speed": 1 / SECOND_LENGTH_SCALE}))
    assert len(slow) == len(slowed)
    np.testing.assert_allclose(slow, slowed, atol=1e-4)
    faster = derived.one_shot(ids, QUIET.model_copy(update={"speed": SECOND_LENGTH_SCALE}))
    frames = len(faster) // derived.hop, len(slow) // derived.hop
    assert abs(frames[0] - frames[1] / SECOND_LENGTH_SCALE) <= 1, frames


def test_cli_synth_with_the_second_voice_writes_a_16000_hz_wav(
    second_voice_root: Path, tmp_path: Path
) -> None:
    out = tmp_path / "derived.wav"
    result = _ttsvc("synth", TEXT, "-o", str(out), "--voice", SECOND_VOICE,
                    "--engines-dir", str(second_voice_root), cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"engines {SECOND_VOICE} v1" in result.stdout
    with wave.open(str(out), "rb") as wav:
        assert wav.getframerate() == SECOND_SAMPLE_RATE
        assert wav.getnchannels() == 1
        assert wav.getnframes() > SECOND_SAMPLE_RATE  # over a second of speech


def _not_onnx(model: Path) -> None:
    model.write_bytes(os.urandom(4096))


def _not_piper(model: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "not-piper",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
    )  # fmt: skip
    onnx.save(helper.make_model(graph), str(model))


def _config_edit(edit: dict[str, object]) -> object:
    def apply(model: Path) -> None:
        config = model.with_name(model.name + ".json")
        data = json.loads(config.read_text(encoding="utf-8"))
        for key, value in edit.items():
            if value is None:
                del data[key]
            else:
                data[key] = value
        config.write_text(json.dumps(data), encoding="utf-8")

    return apply


@pytest.mark.parametrize(
    ("spoil", "says"),
    [
        (_config_edit({"phoneme_id_map": None}), "no phoneme_id_map"),
        (_config_edit({"espeak": {"voice": "en-gb"}}), "espeak.voice 'en-gb'"),
        (_not_onnx, "not a valid ONNX model"),
        (_not_piper, "not a Piper voice graph: no input(s) input, input_lengths, scales"),
    ],
    ids=["config-without-phoneme-map", "unknown-espeak-voice", "not-onnx", "not-a-piper-graph"],
)
def test_a_bad_checkpoint_pair_is_one_clear_line_and_publishes_nothing(
    spoil: object, says: str, tmp_path: Path
) -> None:
    model, config = derive_checkpoint(tmp_path / "checkpoint", "bad-voice")
    assert callable(spoil)
    spoil(model)
    engines = tmp_path / "engines"
    result = _ttsvc("compile", "--checkpoint", str(model), "--output-dir", str(engines),
                    cwd=tmp_path)  # fmt: skip
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    progress = re.compile(r"ttsvc compile: +\d+\.\d s  ")
    errors = [line for line in result.stderr.splitlines() if not progress.match(line)]
    assert len(errors) == 1, result.stderr
    faulty = model if "ONNX" in says or "graph" in says else config
    assert errors[0].startswith(f"ttsvc compile: {faulty}: "), errors[0]
    assert says in errors[0], errors[0]
    assert not (engines / "bad-voice").exists()
    assert EngineRepository(engines).voices() == []
    assert result.stdout == ""
