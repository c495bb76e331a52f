"""Lifting 1-D convolutions to 2-D ones: same output, and the compile keeps the faster layout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ttsvc.backends.onnxruntime import create_session
from ttsvc.compile import optimize
from ttsvc.compile.build import default_checkpoint
from ttsvc.compile.inputs import load_piper_graph
from ttsvc.compile.layout import CONV1D, CONV2D, lift_convolutions, timing_feeds
from ttsvc.compile.split import SplitEngines, split_model


@pytest.fixture(scope="module")
def engines() -> SplitEngines:
    return split_model(load_piper_graph(default_checkpoint()[0]))


def _run(model: onnx.ModelProto, path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    optimize.optimize(model, path)
    return np.asarray(create_session(path, 1).run(None, feeds)[0])


def _conv_ranks(model: onnx.ModelProto) -> set[int]:
    weights = {i.name: len(i.dims) for i in model.graph.initializer}
    return {weights[n.input[1]] for n in model.graph.node
            if n.op_type in ("Conv", "ConvTranspose") and n.input[1] in weights}  # fmt: skip


@pytest.mark.parametrize("name", ["acoustic", "flow", "vocoder"])
def test_lifted_engines_compute_what_the_split_engines_do(
    engines: SplitEngines, name: str, tmp_path: Path
) -> None:
    model = getattr(engines, name)
    lifted, convs = lift_convolutions(model)
    onnx.checker.check_model(lifted)
    assert convs > 0 and _conv_ranks(model) == {3} and 4 in _conv_ranks(lifted)
    ids = [int(i) for i in np.arange(40) % 60 + 1]
    feeds = timing_feeds(model, ids)
    before = _run(model, tmp_path / "plain.onnx", feeds)
    after = _run(lifted, tmp_path / "lifted.onnx", feeds)
    assert before.shape == after.shape
    assert np.max(np.abs(before - after)) <= 1e-4  # float rounding, not a different function


def test_an_operand_whose_broadcast_would_change_keeps_its_op_one_dimensional(
    tmp_path: Path,
) -> None:
    """A [C, 1] operand broadcasts against [N, C, T] by channel, but against [N, C, 1, T] it
    would not: the Add reading it stays outside the lifted region (squeezed back before it)."""
    rng = np.random.default_rng(1)
    weight = numpy_helper.from_array(rng.standard_normal((4, 4, 3)).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.standard_normal((4, 1)).astype(np.float32), "b")
    half = numpy_helper.from_array(np.array(0.5, dtype=np.float32), "half")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1]),
         helper.make_node("Mul", ["c", "half"], ["m"]),  # a scalar: lifted with the Conv
         helper.make_node("Add", ["m", "b"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, "T"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, "T"])],
        [weight, bias, half],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    lifted, convs = lift_convolutions(model)
    assert convs == 1
    add = next(n for n in lifted.graph.node if n.op_type == "Add")
    producer = next(n for n in lifted.graph.node if add.input[0] in n.output)
    assert producer.op_type == "Squeeze"
    assert [o.name for o in lifted.graph.output] == ["y"]
    feeds = {"x": rng.standard_normal((1, 4, 9)).astype(np.float32)}
    np.testing.assert_allclose(_run(lifted, tmp_path / "l.onnx", feeds),
                               _run(model, tmp_path / "m.onnx", feeds), atol=1e-5)  # fmt: skip


@pytest.mark.parametrize(("keep_at", "kept"), [(0.0, CONV2D), (float("inf"), CONV1D)])
def test_the_compile_keeps_the_layout_its_timing_favours(
    engines: SplitEngines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep_at: float,
    kept: str,
) -> None:
    monkeypatch.setattr(optimize, "KEEP_LIFTED", keep_at)
    dst = tmp_path / "vocoder.onnx"
    layout, gain = optimize.optimize_fastest(engines.vocoder, dst, [1, 2, 3], lift=True)
    assert layout == kept and gain > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vocoder.onnx"]
    saved = onnx.load(str(dst))
    lifted = any(n.domain == "com.microsoft.nchwc" for n in saved.graph.node) or any(
        len(i.dims) == 4 for i in saved.graph.initializer)  # fmt: skip
    assert lifted == (kept == CONV2D)


def test_no_lifting_asked_leaves_the_engine_as_it_was(
    engines: SplitEngines, tmp_path: Path
) -> None:
    layout, gain = optimize.optimize_fastest(engines.vocoder, tmp_path / "v.onnx", [1],
                                             lift=False)  # fmt: skip
    assert (layout, gain) == (CONV1D, 1.0)


def test_a_graph_with_subgraphs_is_left_as_it_is() -> None:
    """A branch body may read an outer tensor by name; lifting renames tensors, so it is not
    tried on such graphs (none of Piper's engines has one)."""
    weight = numpy_helper.from_array(np.ones((2, 2, 3), np.float32), "w")
    branch = helper.make_graph([helper.make_node("Identity", ["c"], ["b"])], "branch", [],
                               [helper.make_tensor_value_info("b", TensorProto.FLOAT, None)])
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1]),
         helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=branch)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, "T"]),
              helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [weight],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    lifted, convs = lift_convolutions(model)
    assert convs == 0 and lifted.graph == model.graph
