"""The graph split is found from structure, and refuses graphs of another shape."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from ttsvc.compile.build import default_checkpoint
from ttsvc.compile.split import find_split, split_model
from ttsvc.errors import GraphShapeError


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
    assert [o.name for o in engines.acoustic.graph.output] == ["latents", "mask"]
    assert [i.name for i in engines.flow.graph.input] == ["latents", "mask"]
    assert [o.name for o in engines.flow.graph.output] == ["frames"]
    assert [i.name for i in engines.vocoder.graph.input] == ["frames"]
    assert [o.name for o in engines.vocoder.graph.output] == ["output"]
    at_decoder = split_model(voice_model, "decoder")
    assert at_decoder.flow is None
    assert [o.name for o in at_decoder.acoustic.graph.output] == ["frames"]


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
