"""Multi-speaker voices through the split and the compile, on a voice derived from the packaged
one (``tests/speakers.py``): ``sid`` reaches every engine that reads it, and the manifest
records the speakers."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from tests.speakers import SPEAKERS
from ttsvc.compile.build import compile_voice, default_checkpoint
from ttsvc.compile.inputs import CompileOptions
from ttsvc.compile.reference import STREAM_TOLERANCE, checked_speakers
from ttsvc.compile.split import find_split, split_model
from ttsvc.errors import GraphShapeError
from ttsvc.repository.layout import EngineVersion
from ttsvc.repository.manifest import load_manifest


def _inputs(model: onnx.ModelProto | None) -> list[str]:
    assert model is not None
    return [i.name for i in model.graph.input]


def test_every_engine_that_reads_the_speaker_takes_sid(
    multi_speaker_checkpoint: tuple[Path, Path],
) -> None:
    model = onnx.load(str(multi_speaker_checkpoint[0]))
    split = find_split(model, "flow")
    # the cut is where it is for the single-speaker voice: the speaker does not move it
    assert (split.latent, split.mask, split.decoder_input) == (
        "/Add_output_0", "/Cast_2_output_0", "/Mul_7_output_0")  # fmt: skip
    assert split.speaker_readers == {"acoustic", "flow", "vocoder"}
    engines = split_model(model, "flow")
    assert _inputs(engines.acoustic) == ["input", "input_lengths", "scales", "sid"]
    assert _inputs(engines.flow) == ["latents", "mask", "sid"]
    assert _inputs(engines.vocoder) == ["frames", "sid"]
    at_decoder = split_model(model, "decoder")
    assert at_decoder.split.speaker_readers == {"acoustic", "vocoder"}
    assert _inputs(at_decoder.vocoder) == ["frames", "sid"]


def test_a_single_speaker_voice_has_no_speaker_input() -> None:
    engines = split_model(onnx.load(str(default_checkpoint()[0])), "flow")
    assert engines.split.speaker_readers == frozenset()
    assert "sid" not in _inputs(engines.acoustic) + _inputs(engines.flow) + _inputs(
        engines.vocoder
    )


def test_the_derived_voice_compiles_with_its_speakers_in_the_manifest(
    multi_speaker_version: EngineVersion,
) -> None:
    manifest = load_manifest(multi_speaker_version.path)
    assert manifest.num_speakers == 3 and manifest.speakers == SPEAKERS
    assert sorted(manifest.files) == [
        "acoustic.onnx", "flow.onnx", "flow_plain.onnx", "vocoder.onnx", "vocoder_plain.onnx",
        "voice.json"]  # fmt: skip
    # the split engines matched the unsplit graph for every speaker checked, windows too
    assert manifest.quality["one_shot_max_abs_error"] <= 1e-4
    assert set(manifest.contexts) == {"flow", "vocoder"}
    for context in manifest.contexts.values():
        assert context.max_abs_error <= STREAM_TOLERANCE and context.left == 0  # stateful
    voice = json.loads((multi_speaker_version.path / "voice.json").read_text(encoding="utf-8"))
    assert voice["speaker_id_map"] == SPEAKERS


def test_checked_speakers_cover_a_small_voice_and_sample_a_large_one() -> None:
    assert checked_speakers(1) == [0]
    assert checked_speakers(3) == [0, 1, 2]
    assert checked_speakers(904) == [0, 452, 903]


def _rewritten_config(config: Path, tmp_path: Path, **changes: object) -> Path:
    data = json.loads(config.read_text(encoding="utf-8")) | changes
    out = tmp_path / "changed.onnx.json"
    out.write_text(json.dumps(data), encoding="utf-8")
    return out


@pytest.mark.parametrize(
    ("changes", "match"),
    [({"num_speakers": 1, "speaker_id_map": {}}, "takes a speaker id input.*num_speakers 1"),
     ({"speaker_id_map": {"joe": 0, "ghost": 7}}, "outside 0..2")],
)  # fmt: skip
def test_a_config_that_does_not_fit_the_graph_is_refused(
    multi_speaker_checkpoint: tuple[Path, Path], tmp_path: Path,
    changes: dict[str, object], match: str,
) -> None:  # fmt: skip
    model, config = multi_speaker_checkpoint
    changed = _rewritten_config(config, tmp_path, **changes)
    with pytest.raises(GraphShapeError, match=match):
        compile_voice(CompileOptions(model, changed, tmp_path / "engines", "v"))
    assert not (tmp_path / "engines").exists()  # refused before anything was staged
