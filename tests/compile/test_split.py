"""The graph split is found from structure, and refuses graphs of another shape."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from ttsvc.compile.build import default_checkpoint
from ttsvc.compile.split import find_split, split_model
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
