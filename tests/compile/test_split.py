"""The graph split is found from structure, and refuses graphs of another shape."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from ttsvc.compile.build import default_checkpoint
from ttsvc.compile.speed import follow_speed, reference_durations
from ttsvc.compile.split import SplitEngines, find_split, split_model
from ttsvc.errors import GraphShapeError
from ttsvc.text.frontend import TextFrontEnd
from ttsvc.voice import VoiceConfig


@pytest.fixture(scope="module")
def voice_model() -> onnx.ModelProto:
    model, _ = default_checkpoint()
    return onnx.load(str(model))


def test_flow_split_found_by_structure(voice_model: onnx.ModelProto) -> None:
    split = find_split(voice_model, "flow")
    # ARCHITECTURE.md measured these boundaries for the default voice; the code found them alone
    assert split.latent == "/Add_output_0"
    assert split.mask == "/Cast_2_output_0"
    assert split.decoder_input == "/Mul_7_output_0"
    assert split.sentence_inputs == ("input", "input_lengths", "scales")


def test_decoder_split_found_by_structure(voice_model: onnx.ModelProto) -> None:
    split = find_split(voice_model, "decoder")
    assert split.decoder_input == "/Mul_7_output_0"
    assert split.latent is None and split.mask is None


def test_split_engines_have_stable_boundary_names(voice_model: onnx.ModelProto) -> None:
    engines = split_model(voice_model, "flow")
    assert engines.flow is not None
    assert [o.name for o in engines.acoustic.graph.output] == ["latents", "mask", "durations"]
    assert [i.name for i in engines.flow.graph.input] == ["latents", "mask"]
    assert [o.name for o in engines.flow.graph.output] == ["frames"]
    assert [i.name for i in engines.vocoder.graph.input] == ["frames"]
    assert [o.name for o in engines.vocoder.graph.output] == ["output"]
    at_decoder = split_model(voice_model, "decoder")
    assert at_decoder.flow is None
    assert [o.name for o in at_decoder.acoustic.graph.output] == ["frames", "durations"]


def test_renamed_tensors_do_not_matter(voice_model: onnx.ModelProto) -> None:
    """Rename every tensor: the split must still be found (it does not rely on names)."""
    model = onnx.ModelProto()
    model.CopyFrom(voice_model)
    names: dict[str, str] = {}
    for i, node in enumerate(model.graph.node):
        node.name = f"n{i}"
        for j, out in enumerate(node.output):
            names[out] = f"t{i}_{j}"
            node.output[j] = names[out]
    for node in model.graph.node:
        for j, inp in enumerate(node.input):
            node.input[j] = names.get(inp, inp)
    for out in model.graph.output:
        out.name = names.get(out.name, out.name)
    split = find_split(model, "flow")
    assert split.latent == names["/Add_output_0"]
    assert split.mask == names["/Cast_2_output_0"]
    assert split.decoder_input == names["/Mul_7_output_0"]


def test_graph_without_vocoder_is_refused() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    with pytest.raises(GraphShapeError, match="ConvTranspose"):
        find_split(helper.make_model(graph))


def _renamed(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose every tensor and node has a meaningless name (inputs and output kept)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    keep = {v.name for v in [*out.graph.input, *out.graph.output]}
    names: dict[str, str] = {}

    def new(name: str) -> str:
        if not name or name in keep:
            return name
        return names.setdefault(name, f"t{len(names)}")

    for node in out.graph.node:
        node.name = ""
        node.input[:] = [new(n) for n in node.input]
        node.output[:] = [new(n) for n in node.output]
    for init in out.graph.initializer:
        init.name = new(init.name)
    for value in out.graph.value_info:
        value.name = new(value.name)
    return out


def test_durations_are_found_by_structure_and_give_the_latents_frames(
    voice_model: onnx.ModelProto, voice_config: VoiceConfig
) -> None:
    """With every tensor renamed, the split still finds VITS's rounded durations, outputs them
    as int32 ``durations``, and they are the frames the latents were expanded to: with noise 0
    each id's frames repeat one encoder column, so the latents change column exactly at the
    durations' running sum."""
    split = find_split(_renamed(voice_model), "flow")
    assert split.durations is not None and split.durations.startswith("t")
    engines = split_model(voice_model, "flow")
    session = ort.InferenceSession(engines.acoustic.SerializeToString(),
                                   providers=["CPUExecutionProvider"])  # fmt: skip
    (sentence,) = TextFrontEnd(voice_config).sentences("Red, green, blue and yellow.")
    ids = np.asarray([sentence.ids], dtype=np.int64)
    latents, _, durations = session.run(None, {
        "input": ids, "input_lengths": np.asarray([ids.shape[1]]),
        "scales": np.asarray([0.0, 1.0, 0.0], dtype=np.float32)})  # fmt: skip
    assert durations.dtype == np.int32 and durations.shape == (1, 1, ids.shape[1])
    assert int(durations.sum()) == latents.shape[2]
    z = latents[0]
    changes = [t for t in range(1, z.shape[1]) if not np.array_equal(z[:, t], z[:, t - 1])]
    bounds = np.cumsum(durations.reshape(-1))[:-1]
    assert changes == sorted({int(b) for b in bounds if 0 < b < z.shape[1]})


def _acoustic_runs(
    engines: SplitEngines, ids: np.ndarray, length_scales: list[float]
) -> list[list[np.ndarray]]:
    """Latents, mask and durations of the sentence engine at each length scale, noise 0."""
    session = ort.InferenceSession(engines.acoustic.SerializeToString(),
                                   providers=["CPUExecutionProvider"])  # fmt: skip
    return [
        [np.asarray(out) for out in session.run(None, {
            "input": ids, "input_lengths": np.asarray([ids.shape[1]]),
            "scales": np.asarray([0.0, scale, 0.0], dtype=np.float32)})]
        for scale in length_scales
    ]  # fmt: skip


@pytest.mark.parametrize("voice_scale", [1.0, 1.3])
def test_frames_follow_speed_above_1_and_are_pipers_at_or_below(
    voice_model: onnx.ModelProto, voice_config: VoiceConfig, voice_scale: float
) -> None:
    """Above speed 1 the frame count follows 1/speed (to a frame, Piper's rounding up gave ~2x
    at speed 4) and every phoneme keeps a frame: only pad ids may get none; at speed 1 and below
    every output is Piper's own graph's, to the bit. The durations stay the frames the latents
    were expanded to, zero-frame pads included, and are the numpy rule's. Found by structure
    (every tensor renamed) and for a voice whose own length scale is not 1."""
    pads = voice_config.phoneme_id_map["_"]
    engines = split_model(_renamed(voice_model), "flow", voice_scale, pads)
    assert engines.split.follows_speed
    piper = split_model(voice_model, "flow")
    assert not piper.split.follows_speed
    (sentence,) = TextFrontEnd(voice_config).sentences("The quick brown fox jumps over a dog.")
    ids = np.asarray([sentence.ids], dtype=np.int64)
    is_pad = np.isin(ids, pads)[:, None, :]
    speeds = [0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0]
    scales = [voice_scale / speed for speed in speeds]
    ours, theirs = _acoustic_runs(engines, ids, scales), _acoustic_runs(piper, ids, scales)
    for speed, got, expected in zip(speeds, ours, theirs, strict=True):
        if speed <= 1.0:
            for a, b in zip(got, expected, strict=True):
                np.testing.assert_array_equal(a, b)
    d1 = ours[speeds.index(1.0)][2]
    frames = {speed: run[0].shape[2] for speed, run in zip(speeds, ours, strict=True)}
    for speed in (1.5, 2.0, 3.0, 4.0):
        durations = ours[speeds.index(speed)][2]
        assert abs(frames[speed] - frames[1.0] / speed) <= 1, (speed, frames)
        assert durations[~is_pad].min() >= 1, speed  # no phoneme vanishes
        expected = reference_durations(d1.astype(np.float32), is_pad, speed, voice_scale)
        np.testing.assert_array_equal(durations, expected.astype(np.int32))
    piper_4 = theirs[speeds.index(4.0)][0].shape[2]
    assert piper_4 > 1.5 * frames[1.0] / 4  # what the rewrite is for
    # up to speed ~2 every id keeps a frame, as Piper's; the pads give theirs up past that
    assert ours[speeds.index(1.5)][2].min() >= 1

    latents, _, durations = ours[speeds.index(4.0)]
    assert durations[is_pad].min() == 0 and int(durations.sum()) == latents.shape[2]
    z = latents[0]
    changes = [t for t in range(1, z.shape[1]) if not np.array_equal(z[:, t], z[:, t - 1])]
    bounds = {int(b) for b in np.cumsum(durations.reshape(-1))[:-1] if 0 < b < z.shape[1]}
    assert set(changes) <= bounds


def test_without_pad_ids_no_id_loses_its_frame(
    voice_model: onnx.ModelProto, voice_config: VoiceConfig
) -> None:
    """A voice with no pad ids to give up keeps a frame for every id: its speech follows 1/speed
    while it can, then stops at one frame an id, as Piper's does, never shorter."""
    engines = split_model(voice_model, "flow", 1.0, ())
    assert engines.split.follows_speed
    (sentence,) = TextFrontEnd(voice_config).sentences("The quick brown fox jumps over a dog.")
    ids = np.asarray([sentence.ids], dtype=np.int64)
    (fast, _, durations), (plain, _, _) = _acoustic_runs(engines, ids, [1 / 4.0, 1.0])
    assert durations.min() >= 1 and fast.shape[2] == ids.shape[1] < plain.shape[2] / 2


def test_a_graph_without_phoneme_ids_to_compare_keeps_pipers_durations(
    voice_model: onnx.ModelProto,
) -> None:
    """The pads are told apart by the phoneme-id input; with no rank-2 integer input the
    durations are computed from, no rule that could drop a phoneme is guessed."""
    model = onnx.ModelProto()
    model.CopyFrom(voice_model)
    (ids,) = [i for i in model.graph.input if i.name == "input"]
    ids.type.tensor_type.shape.dim.pop()  # rank 1: not recognisably [batch, ids] any more
    durations = find_split(voice_model, "flow").durations
    assert durations is not None
    assert follow_speed(model, durations, 1.0) is None


def test_a_graph_without_the_length_scale_product_keeps_pipers_durations(
    voice_model: onnx.ModelProto,
) -> None:
    """Durations not made as ``ceil(w * scales[1])`` are left alone (no guess at the speed)."""
    model = onnx.ModelProto()
    model.CopyFrom(voice_model)
    ceil = next(n for n in model.graph.node if n.op_type == "Ceil")
    mul = next(n for n in model.graph.node if ceil.input[0] in n.output)
    mul.op_type = "Add"  # still a graph that runs, no longer the length scale's product
    engines = split_model(model, "flow", 1.0)
    assert not engines.split.follows_speed and engines.split.durations is not None
