"""Durations that follow the requested speed above 1, as a change to the sentence graph.

VITS turns its predicted durations into frames with ``ceil(w * length_scale)``, and a request's
speed divides the length scale. Rounding up gives every input id at least one frame, Piper's
pad ids between phonemes included, so above speed ~2 the sum of those minimum frames dominates
and speech stops shortening: measured on the packaged voice, 4.76 / 2.97 / 2.46 / 2.32 s at
speed 1 / 2 / 3 / 4.

Above speed 1 the rewritten graph starts from the voice's own durations at speed 1,
``D1 = ceil(w * voice_length_scale)``, and shares the sentence's target length
``T = sum(D1) / speed`` out so that no id loses its sound before it must
(:func:`reference_durations` is the same rule in numpy):

* every id first keeps a floor of one frame (``f_i = min(D1_i, 1)``: ids past the sentence's
  length, masked to 0, stay 0), as Piper's rounding up keeps it;
* when those floors alone exceed ``T`` (about speed 2.2 on the packaged voice, where Piper's
  length stopped), Piper's pad ids (the phoneme map's ``_``, put between every two phonemes) lose
  theirs: a pad may get no frame, a phoneme always gets one;
* the rest, ``T - sum(f)``, is shared in proportion to each id's frames above its floor,
  ``D1_i - f_i``, rounding the running sum so the total is ``round(T)``:
  ``d_i = f_i + round(C_i) - round(C_(i-1))``, ``C = cumsum((D1 - f) * k)``,
  ``k = max(0, T - sum(f)) / sum(D1 - f)``.

So the length follows 1/speed to a frame up to ``sum(D1) / (phoneme ids)`` (above 4 on the
packaged voice), and past that stops at one frame per phoneme. Dividing every id's frames by the
speed and rounding the running sum (the first version of this change) followed 1/speed too, but
gave whole phonemes zero frames from speed 2 on, and an offline recognizer's word error rate
was 0.82 at 2x, where Piper's own speech of that length scores 0.60 and this rule 0.61
(``benchmarks/speed_bench.py``).

At speed 1 and below the graph takes Piper's own ``ceil(w * length_scale)``, so its output there
is Piper's, to the bit. Every reader of the rounded-up tensor (the alignment path, the frame
count behind the mask, the ``durations`` output) reads the chosen one, so they cannot disagree.
The alignment path repeats each id's encoder column for its frames, so a zero-frame pad is
simply skipped.

The speed is ``voice_length_scale / scales[1]``: the voice's length scale is baked in as a
constant at compile time, as the runtime sends ``voice_length_scale / speed``
(``SynthesisParams.scales``). The pad ids are the voice config's ``phoneme_id_map["_"]``
(``split_model``'s ``pad_ids``; Piper's 0 when not given); the phoneme-id input they are
compared with is found by structure (the rank-2 integer graph input the durations are computed
from).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SCALES_INPUT = "scales"
"""Piper's input ``[noise_scale, length_scale, noise_w]``."""
PIPER_PAD_IDS = (0,)
"""The ids of Piper's pad symbol ``_`` in every voice Piper trains (its phonemizer's map, and
the value its batches are padded with); a voice config's ``phoneme_id_map["_"]`` says so."""
_PREFIX = "speed_durations"
_INTEGER = (TensorProto.INT64, TensorProto.INT32)


def reference_durations(
    d1: np.ndarray, is_pad: np.ndarray, speed: float, voice_length_scale: float = 1.0
) -> np.ndarray:
    """The rewritten graph's frames per id above speed 1, in numpy: ``d1`` the voice's speed-1
    frames ``[batch, 1, ids]`` (whole numbers), ``is_pad`` where the ids are pad ids. The speed
    is taken as the graph takes it, from the float32 length scale the runtime sends."""
    d1 = np.asarray(d1, dtype=np.float32)
    voice = np.float32(voice_length_scale)
    per_speed = np.float32(voice_length_scale / speed) / voice
    target = d1.sum(-1, keepdims=True) * per_speed
    floor = np.minimum(d1, 1.0)
    floor = np.where(floor.sum(-1, keepdims=True) > target,
                     np.where(is_pad, 0.0, floor), floor)  # fmt: skip
    extra = d1 - floor
    share = np.maximum(target - floor.sum(-1, keepdims=True), 0.0)
    scaled = extra * (share / np.maximum(extra.sum(-1, keepdims=True), 1.0))
    ends = np.round(np.cumsum(scaled, -1))
    return (floor + np.diff(ends, prepend=0.0, axis=-1)).astype(np.float32)


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


def _phoneme_ids_input(graph: onnx.GraphProto, tensor: str) -> onnx.ValueInfoProto | None:
    """The phoneme-id input ``tensor`` is computed from: its one rank-2 integer graph input
    (``[batch, ids]``; the lengths and a speaker id are rank 1)."""
    found = _graph_inputs_of(graph, tensor)
    ids = [
        i for i in graph.input
        if i.name in found and i.type.tensor_type.elem_type in _INTEGER
        and len(i.type.tensor_type.shape.dim) == 2
    ]  # fmt: skip
    return ids[0] if len(ids) == 1 else None


def follow_speed(
    model: onnx.ModelProto,
    rounded: str,
    voice_length_scale: float,
    pad_ids: Sequence[int] = PIPER_PAD_IDS,
) -> str | None:
    """Make every reader of ``rounded`` (VITS's ``w_ceil``) read durations that follow 1/speed
    above speed 1; returns the new tensor's name, or ``None`` (graph unchanged) when ``rounded``
    is not ``Ceil(w * length_scale)`` with the length scale read from ``scales`` alone, or the
    phoneme-id input is not found.

    ``pad_ids``: the voice's pad symbol's ids (``phoneme_id_map["_"]``), which may lose their
    last frame when the speed asks for it; empty, no id ever does (and the length stops at one
    frame per id, as Piper's). Changes ``model`` in place. The durations must be
    ``[batch, 1, ids]`` (VITS's shape): the running sum runs along the last axis.
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
    ids = _phoneme_ids_input(graph, base)
    if ids is None:
        return None
    ids_type = ids.type.tensor_type.elem_type

    def name(what: str) -> str:
        return f"{_PREFIX}/{what}"

    out = name("durations")
    consts: dict[str, np.ndarray] = {
        name("voice_length_scale"): np.asarray(voice_length_scale, dtype=np.float32),
        name("zero_f"): np.asarray(0.0, dtype=np.float32),
        name("one_f"): np.asarray(1.0, dtype=np.float32),
        name("axis"): np.asarray(-1, dtype=np.int64),
        name("axes"): np.asarray([-1], dtype=np.int64),
        name("ids_axes"): np.asarray([1], dtype=np.int64),
        name("pads"): np.asarray([0, 0, 1, 0, 0, 0], dtype=np.int64),
        name("zero"): np.asarray([0], dtype=np.int64),
        name("minus_one"): np.asarray([-1], dtype=np.int64),
        name("last_axis"): np.asarray([2], dtype=np.int64),
    }
    nodes: list[tuple[str, list[str], str]] = [
        # the voice's speed-1 durations, computed as the graph computes them at speed 1
        ("Mul", [base, name("voice_length_scale")], "w1"),
        ("Ceil", [name("w1")], "d1"),
        ("Div", [length_scale, name("voice_length_scale")], "per_speed"),  # 1 / speed
        ("ReduceSum", [name("d1"), name("axes")], "d1_total"),
        ("Mul", [name("d1_total"), name("per_speed")], "target"),
        # one frame for every id (0 past the sentence: d1 is masked there) ...
        ("Min", [name("d1"), name("one_f")], "floor_all"),
        ("ReduceSum", [name("floor_all"), name("axes")], "floor_all_total"),
        ("Greater", [name("floor_all_total"), name("target")], "too_many"),
        # ... or, when that is more than the target, for every id but the pads
        ("Unsqueeze", [ids.name, name("ids_axes")], "ids"),  # [batch, 1, ids] as d1
    ]
    pad_masks = []
    for k, pad in enumerate(pad_ids):
        consts[name(f"pad_{k}")] = np.asarray(pad, dtype=helper.tensor_dtype_to_np_dtype(ids_type))
        nodes.append(("Equal", [name("ids"), name(f"pad_{k}")], f"is_pad_{k}"))
        pad_masks.append(name(f"is_pad_{k}"))
    if pad_masks:
        is_pad = pad_masks[0]
        for k, mask in enumerate(pad_masks[1:], start=1):
            nodes.append(("Or", [is_pad, mask], f"is_pad_or_{k}"))
            is_pad = name(f"is_pad_or_{k}")
        nodes += [
            ("Where", [is_pad, name("zero_f"), name("floor_all")], "floor_phonemes"),
            ("Where", [name("too_many"), name("floor_phonemes"), name("floor_all")], "floor"),
        ]
        floor = name("floor")
    else:
        floor = name("floor_all")
    nodes += [
        # the rest of the target, in proportion to each id's frames above its floor
        ("Sub", [name("d1"), floor], "extra"),
        ("ReduceSum", [floor, name("axes")], "floor_total"),
        ("Sub", [name("target"), name("floor_total")], "left"),
        ("Max", [name("left"), name("zero_f")], "share"),
        ("ReduceSum", [name("extra"), name("axes")], "extra_total"),
        ("Max", [name("extra_total"), name("one_f")], "extra_divisor"),  # 0 only if extra is
        ("Div", [name("share"), name("extra_divisor")], "per_frame"),
        ("Mul", [name("extra"), name("per_frame")], "scaled"),
        ("CumSum", [name("scaled"), name("axis")], "running"),
        ("Round", [name("running")], "ends"),
        # the previous id's end, 0 before the first: shift the ends one id along
        ("Pad", [name("ends"), name("pads")], "padded"),
        ("Slice", [name("padded"), name("zero"), name("minus_one"), name("last_axis")], "starts"),
        ("Sub", [name("ends"), name("starts")], "added"),
        ("Add", [floor, name("added")], "fast"),
        ("Less", [length_scale, name("voice_length_scale")], "above_1"),
    ]
    graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in consts.items())
    new = [helper.make_node(op, inputs, [name(o)], name=name(o)) for op, inputs, o in nodes]
    for node in new:
        if node.op_type == "ReduceSum":
            node.attribute.append(helper.make_attribute("keepdims", 1))
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
