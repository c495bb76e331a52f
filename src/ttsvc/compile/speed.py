"""Durations that follow the requested speed above 1, as a change to the sentence graph.

VITS turns its predicted durations into frames with ``ceil(w * length_scale)``, and a request's
speed divides the length scale. Rounding up gives every input id at least one frame, Piper's
pad ids between phonemes included, so above speed ~2 the sum of those minimum frames dominates
and speech stops shortening: measured on the packaged voice, 4.76 / 2.97 / 2.46 / 2.32 s at
speed 1 / 2 / 3 / 4.

Above speed 1 the rewritten graph takes the voice's own durations at speed 1,
``D1 = ceil(w * voice_length_scale)``, divides them by the speed, and rounds their running sum:
``d_i = round(C_i) - round(C_(i-1))`` with ``C = cumsum(D1 / speed)``. The total then follows
1/speed to within one frame; an id may get no frame (the alignment path repeats each id's
encoder column for its frames, so a zero-frame id is simply skipped), and every frame count is
a whole number that is never negative (``C`` does not fall). At speed 1 and below the graph takes
Piper's own ``ceil(w * length_scale)``, so its output there is Piper's, to the bit. Every reader
of the rounded-up tensor (the alignment path, the frame count behind the mask, the
``durations`` output) reads the chosen one, so they cannot disagree.

The speed is ``voice_length_scale / scales[1]``: the voice's length scale is baked in as a
constant at compile time, as the runtime sends ``voice_length_scale / speed``
(``SynthesisParams.scales``).
"""

from __future__ import annotations

from collections import deque

import numpy as np
import onnx
from onnx import helper, numpy_helper

SCALES_INPUT = "scales"
"""Piper's input ``[noise_scale, length_scale, noise_w]``."""
_PREFIX = "speed_durations"


def _graph_inputs_of(graph: onnx.GraphProto, tensor: str) -> set[str]:
    """The graph inputs ``tensor`` is computed from."""
    producer = {out: node for node in graph.node for out in node.output}
    inputs = {i.name for i in graph.input}
    found: set[str] = set()
    seen: set[str] = set()
    todo = deque([tensor])
    while todo:
        name = todo.popleft()
        if name in seen or not name:
            continue
        seen.add(name)
        if name in inputs:
            found.add(name)
        node = producer.get(name)
        if node is not None:
            todo.extend(node.input)
    return found


def follow_speed(model: onnx.ModelProto, rounded: str, voice_length_scale: float) -> str | None:
    """Make every reader of ``rounded`` (VITS's ``w_ceil``) read durations that follow 1/speed
    above speed 1; returns the new tensor's name, or ``None`` (graph unchanged) when ``rounded``
    is not ``Ceil(w * length_scale)`` with the length scale read from ``scales`` alone.

    Changes ``model`` in place. The durations must be ``[batch, 1, ids]`` (VITS's shape): the
    running sum runs along the last axis.
    """
    graph = model.graph
    index = next((i for i, n in enumerate(graph.node) if rounded in n.output), None)
    if index is None or graph.node[index].op_type != "Ceil":
        return None
    ceil = graph.node[index]
    mul = next((n for n in graph.node if ceil.input[0] in n.output), None)
    if mul is None or mul.op_type != "Mul":
        return None
    # the length scale is the operand computed from ``scales`` alone; the other one (exp(logw)
    # masked) reads ``scales`` too, for the duration noise, but also the ids
    scale_only = [i for i in mul.input if _graph_inputs_of(graph, i) == {SCALES_INPUT}]
    if len(scale_only) != 1:
        return None
    length_scale = scale_only[0]
    base = next(i for i in mul.input if i != length_scale)

    def name(what: str) -> str:
        return f"{_PREFIX}/{what}"

    out = name("durations")
    consts: dict[str, np.ndarray] = {
        name("voice_length_scale"): np.asarray(voice_length_scale, dtype=np.float32),
        name("axis"): np.asarray(-1, dtype=np.int64),
        name("pads"): np.asarray([0, 0, 1, 0, 0, 0], dtype=np.int64),
        name("zero"): np.asarray([0], dtype=np.int64),
        name("minus_one"): np.asarray([-1], dtype=np.int64),
        name("last_axis"): np.asarray([2], dtype=np.int64),
    }
    graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in consts.items())
    nodes = [
        # the voice's speed-1 durations, computed as the graph computes them at speed 1
        ("Mul", [base, name("voice_length_scale")], "w1"),
        ("Ceil", [name("w1")], "d1"),
        ("Div", [length_scale, name("voice_length_scale")], "per_speed"),  # 1 / speed
        ("Mul", [name("d1"), name("per_speed")], "scaled"),
        ("CumSum", [name("scaled"), name("axis")], "running"),
        ("Round", [name("running")], "ends"),
        # the previous id's end, 0 before the first: shift the ends one id along
        ("Pad", [name("ends"), name("pads")], "padded"),
        ("Slice", [name("padded"), name("zero"), name("minus_one"), name("last_axis")], "starts"),
        ("Sub", [name("ends"), name("starts")], "fast"),
        ("Less", [length_scale, name("voice_length_scale")], "above_1"),
    ]
    new = [helper.make_node(op, inputs, [name(o)], name=name(o)) for op, inputs, o in nodes]
    new.append(helper.make_node("Where", [name("above_1"), name("fast"), rounded], [out],
                                name=out))  # fmt: skip
    for node in graph.node:
        for i, inp in enumerate(node.input):
            if inp == rounded:
                node.input[i] = out
    for offset, node in enumerate(new, start=1):
        graph.node.insert(index + offset, node)
    for value in graph.output:
        if value.name == rounded:
            value.name = out
    return out
