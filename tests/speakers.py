"""A multi-speaker Piper voice for tests, derived from the packaged single-speaker one.

No multi-speaker voice can be downloaded here, so one is made the way Piper's VITS graphs are
conditioned on a speaker (``gin_channels > 0``): an int64 input ``sid`` [1] picks a row of an
embedding table (``emb_g``), unsqueezed to ``g`` [1, C, 1], and a 1x1 convolution of ``g`` is
added, broadcast over time, to

* the stochastic duration predictor's input (before the cut: the sentence engine needs ``sid``),
* the first WaveNet layer of the first coupling layer the reverse flow runs (where Piper adds
  the slice of ``cond_layer(g)``; inside the flow engine),
* the decoder's input after ``conv_pre`` (``dec.cond``; inside the vocoder engine).

Speaker 0's embedding row is zero and the convolutions have no bias, so speaker 0 adds exact
zeros: it is the original voice. The other rows are random, so those speakers speak at another
pace with another timbre. The config gets ``num_speakers`` and a ``speaker_id_map``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ttsvc.compile.build import default_checkpoint

SPEAKERS = {"joe": 0, "ember": 1, "slate": 2}
"""Speaker names and ids of the derived voice; ``joe`` (0) is the packaged voice itself."""
GIN_CHANNELS = 64
EMBEDDING_SCALE = {"dp": 0.6, "flow": 0.4, "dec": 0.35}
"""How strongly each site is conditioned: enough for a clearly different voice that still
speaks the sentence (durations change by tens of percent, not by multiples)."""

# Tensors of the packaged voice (en_US-joe-medium) the conditioning is added to: the output of
# dp.pre, the zeros Piper adds as g_l when g is None in the first WN layer of flows.6 (the first
# coupling layer the reverse flow runs), and the output of dec.conv_pre.
_DP_PRE = "/dp/pre/Conv_output_0"
_FLOW_ADD = "Add_5591"
_DEC_PRE = "/dec/conv_pre/Conv_output_0"


def _channels(model: onnx.ModelProto, bias: str) -> int:
    init = next(i for i in model.graph.initializer if i.name == bias)
    return int(init.dims[0])


def derive_multi_speaker(directory: Path, seed: int = 15) -> tuple[Path, Path]:
    """Write the derived voice (``.onnx`` and ``.onnx.json``) into ``directory``; return both
    paths, as ``ttsvc compile --checkpoint`` takes them."""
    src_model, src_config = default_checkpoint()
    model = onnx.load(str(src_model))
    graph = model.graph
    rng = np.random.default_rng(seed)

    # the single-speaker export named its phoneme embedding "sid" (the input name it left
    # unused); a real multi-speaker export has that name free for the input
    for init in graph.initializer:
        if init.name == "sid":
            init.name = "enc_p.emb.weight"
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == "sid":
                node.input[i] = "enc_p.emb.weight"

    table = rng.standard_normal((len(SPEAKERS), GIN_CHANNELS)).astype(np.float32)
    table[0] = 0.0
    graph.input.append(helper.make_tensor_value_info("sid", TensorProto.INT64, [1]))
    graph.initializer.append(numpy_helper.from_array(table, "emb_g.weight"))
    graph.initializer.append(numpy_helper.from_array(np.array([2], np.int64), "g_axes"))
    nodes = [
        helper.make_node("Gather", ["emb_g.weight", "sid"], ["emb_g_out"], name="/emb_g/Gather"),
        helper.make_node("Unsqueeze", ["emb_g_out", "g_axes"], ["g"], name="/Unsqueeze_g"),
    ]

    def cond(site: str, channels: int) -> str:
        # a 1x1 conv of g without bias (zero g -> exact zeros), scaled so each channel moves by
        # about EMBEDDING_SCALE[site] for a unit embedding
        scale = EMBEDDING_SCALE[site] / np.sqrt(GIN_CHANNELS)
        weight = (rng.standard_normal((channels, GIN_CHANNELS, 1)) * scale).astype(np.float32)
        graph.initializer.append(numpy_helper.from_array(weight, f"{site}.cond.weight"))
        out = f"/{site}/cond/Conv_output_0"
        nodes.append(helper.make_node("Conv", ["g", f"{site}.cond.weight"], [out],
                                      name=f"/{site}/cond/Conv", kernel_shape=[1]))  # fmt: skip
        return out

    def add_after(tensor: str, site: str, channels: int) -> None:
        conditioned = f"{tensor}_speaker"
        for node in graph.node:
            for i, name in enumerate(node.input):
                if name == tensor:
                    node.input[i] = conditioned
        nodes.append(helper.make_node("Add", [tensor, cond(site, channels)], [conditioned],
                                      name=f"/{site}/cond/Add"))  # fmt: skip

    add_after(_DP_PRE, "dp", _channels(model, "dp.pre.bias"))
    add_after(_DEC_PRE, "dec", _channels(model, "dec.conv_pre.bias"))
    flow_add = next(node for node in graph.node if node.name == _FLOW_ADD)
    flow_add.input[1] = cond("flow", _channels(model, "flow.flows.6.enc.in_layers.0.bias"))

    # keep the graph topologically sorted: each new node just before its first consumer
    produced = {out: node for node in nodes for out in node.output}
    ordered: list[onnx.NodeProto] = [nodes[0], nodes[1]]
    placed = {id(nodes[0]), id(nodes[1])}
    for node in graph.node:
        for name in node.input:
            extra = produced.get(name)
            if extra is not None and id(extra) not in placed:
                for dep in extra.input:  # the cond conv before the Add that reads it
                    pre = produced.get(dep)
                    if pre is not None and id(pre) not in placed:
                        ordered.append(pre)
                        placed.add(id(pre))
                ordered.append(extra)
                placed.add(id(extra))
        ordered.append(node)
    del graph.node[:]
    graph.node.extend(ordered)
    onnx.checker.check_model(model)

    directory.mkdir(parents=True, exist_ok=True)
    model_path = directory / "en_US-trio-medium.onnx"
    onnx.save(model, str(model_path))
    config = json.loads(src_config.read_text(encoding="utf-8"))
    config["num_speakers"] = len(SPEAKERS)
    config["speaker_id_map"] = dict(SPEAKERS)
    config_path = directory / "en_US-trio-medium.onnx.json"
    config_path.write_text(json.dumps(config, ensure_ascii=False, indent=1), encoding="utf-8")
    return model_path, config_path
