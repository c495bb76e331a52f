"""Split a Piper/VITS ONNX voice into a sentence-level engine and a frame-level engine.

Why split at all: the text encoder and duration predictor need the whole sentence (attention over
phonemes), but everything after them is frame-local convolution, so it can run over short windows
of frames and stream audio as soon as the first window is done. The split is found from the
graph's structure, not from the default voice's tensor names, so any Piper/VITS export works:

* the **decoder input** is the data input of the HiFi-GAN's first convolution, found by walking
  back from the first ``ConvTranspose`` (the first upsampling layer) through activations;
* the **flow input** (z_p) is the furthest tensor before the decoder that every frame-level path
  passes through, such that everything between it and the decoder is frame-local (convolutions,
  element-wise ops) and reads nothing else but the frame mask;
* the **durations** (frames per phoneme id, VITS's ``w_ceil``) are the rounded-up (``Ceil``)
  tensor whose cumulative sum (``CumSum``) builds the alignment path that expands the text
  encoder's output to frames. The sentence engine outputs them beside its latents (as int32
  ``durations [1, 1, N]``), so word timestamps come from the very frame counts the audio was
  made with. Given the voice's length scale, the split first puts durations that follow the
  speed above 1 in its place (``speed.py``), and those are what the engine uses and outputs.

Multi-speaker voices (Piper's ``sid`` input) condition the duration predictor, every flow
coupling layer and the decoder on ``g = emb_g[sid]``, one vector for the whole utterance. Tensors
computed from ``sid`` and weights alone are constant over time, so they do not stop a part from
being frame-local: every engine that reads one takes ``sid`` as an input of its own and
recomputes ``g`` (a lookup and 1x1 convolutions on a single frame, negligible beside a window).
That keeps the cut a cut of frames only: a window's inputs are its frames and the speaker id,
exactly what the one-shot graph computes the same frames from, so windowed output stays equal
to one-shot output, and nothing per stream but an integer travels between steps.

``split_at="flow"`` (the default) makes three engines: sentence (encoder, durations, noise),
flow, and vocoder (HiFi-GAN). The sentence engine then does only the encoder work before the
first window can start (27 ms against 70 ms with the flow over the whole sentence, measured for
a 51-character sentence), and flow and vocoder get their own window overlap: measured on the
default voice, the flow needs ~28 frames of context at 0.14 ms/frame, the decoder only ~12 at
0.55 ms/frame, so one shared context of 36/32 frames cost more than twice the overhead.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import onnx

from ttsvc.backends.base import SPEAKER_INPUT
from ttsvc.compile.speed import PIPER_PAD_IDS, follow_speed
from ttsvc.errors import GraphShapeError

SplitPoint = Literal["flow", "decoder"]

# Ops whose output at frame t depends only on a bounded neighbourhood of frames (or on shapes).
# Anything else (attention, cumulative sums, random draws, reductions over time) is sentence-level.
FRAME_LOCAL_OPS = frozenset(
    {
        "Add", "Cast", "Concat", "Constant", "ConstantOfShape", "Conv", "ConvTranspose", "Div",
        "Exp", "Identity", "LeakyRelu", "Mul", "Neg", "Relu", "Shape", "Sigmoid", "Slice", "Split",
        "Sub", "Tanh", "Unsqueeze", "Squeeze",
    }
)  # fmt: skip
_ACTIVATIONS = frozenset({"LeakyRelu", "Relu", "Identity", "Add"})


@dataclass(frozen=True)
class GraphSplit:
    """Where a voice graph is cut, as tensor names of the original graph."""

    sentence_inputs: tuple[str, ...]
    """Inputs of the whole voice (ids, lengths, scales): they feed the sentence engine."""
    decoder_input: str
    """The frames [1, C, T] the HiFi-GAN decoder consumes (the masked flow output)."""
    latent: str | None
    """The flow's input z_p [1, C, T]; ``None`` when splitting at the decoder."""
    mask: str | None
    """The frame mask [1, 1, T] the flow multiplies by; ``None`` when splitting at the decoder."""
    output: str
    """The waveform output of the voice."""
    split_at: SplitPoint
    speaker_readers: frozenset[str] = frozenset()
    """Which engines (``acoustic``, ``flow``, ``vocoder``) read the speaker input: empty for a
    single-speaker voice."""
    durations: str | None = None
    """Frames per input id ``[1, 1, N]`` (float, whole numbers) before the length regulator;
    ``None`` when the graph has no such tensor (no word timestamps then)."""
    follows_speed: bool = False
    """``durations`` is the tensor ``compile/speed.py`` added, which follows 1/speed above
    speed 1, rather than VITS's own rounded-up one."""


class _Graph:
    """Producer/consumer indexes over an ONNX graph, built once per analysis."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for node in graph.node:
            for out in node.output:
                self.producer[out] = node
            for inp in node.input:
                if inp:
                    self.consumers[inp].append(node)
        self.initializers = {init.name for init in graph.initializer}
        self.inputs = [i.name for i in graph.input if i.name not in self.initializers]
        self.speaker = self._speaker_only()

    def _speaker_only(self) -> set[str]:
        """Tensors computed from the speaker input and constants alone: constant over time."""
        if SPEAKER_INPUT not in self.inputs:
            return set()
        constant = set(self.initializers)
        speaker = {SPEAKER_INPUT}
        for node in self.graph.node:  # ONNX keeps nodes in topological order
            inputs = [i for i in node.input if i]
            if not all(i in constant or i in speaker for i in inputs):
                continue
            (speaker if any(i in speaker for i in inputs) else constant).update(node.output)
        return speaker

    def reads_speaker(self, start: str, stops: set[str]) -> bool:
        """Whether the part of the graph between ``stops`` and ``start`` reads the speaker."""
        seen: set[str] = set()
        todo = deque([start])
        while todo:
            name = todo.popleft()
            if name in seen or name in stops or not name:
                continue
            if name in self.speaker:
                return True
            seen.add(name)
            node = self.producer.get(name)
            if node is not None:
                todo.extend(node.input)
        return False

    def closure(self, start: str, stops: set[str]) -> tuple[set[str], set[str]]:
        """Walk producers back from ``start`` until ``stops``.

        Returns the tensors visited and the frontier: tensors that are graph inputs or produced by
        a sentence-level op. An empty frontier means ``stops`` cut the graph cleanly. Speaker-only
        tensors are visited but not walked through: constant over time, they are recomputed
        from the speaker id by each engine that reads them.
        """
        seen: set[str] = set()
        frontier: set[str] = set()
        todo = deque([start])
        while todo:
            name = todo.popleft()
            if name in seen or name in stops or name in self.initializers or not name:
                continue
            seen.add(name)
            if name in self.speaker:
                continue
            node = self.producer.get(name)
            if node is None or node.op_type not in FRAME_LOCAL_OPS:
                frontier.add(name)
                continue
            todo.extend(node.input)
        return seen, frontier


def _decoder_input(g: _Graph) -> str:
    first_up = next((n for n in g.graph.node if n.op_type == "ConvTranspose"), None)
    if first_up is None:
        raise GraphShapeError("no ConvTranspose found: not a HiFi-GAN vocoder graph")
    node = g.producer.get(first_up.input[0])
    while node is not None and node.op_type in _ACTIVATIONS:
        # an Add here is the speaker conditioning (x + cond(g)); follow the data path
        data_inputs = [
            i for i in node.input
            if i in g.producer and i not in g.initializers and i not in g.speaker
        ]  # fmt: skip
        node = g.producer.get(data_inputs[0]) if data_inputs else None
    if node is None or node.op_type != "Conv":
        raise GraphShapeError(
            "the first upsampling layer is not preceded by the decoder's conv_pre"
        )
    return str(node.input[0])


def _durations(g: _Graph, latent: str) -> str | None:
    """The frames-per-id tensor feeding the alignment path of ``latent``, if there is one.

    VITS rounds the predicted durations up (``Ceil``) and turns their cumulative sum into the
    path that repeats each id's encoder output for its frames; the stochastic duration
    predictor's own ``CumSum`` (inside its spline flows) reads no ``Ceil``, so it is not taken.
    Only a tensor the latent depends on counts: it is the one the audio's frames came from.
    """
    ancestors, todo = set(), deque([latent])
    while todo:
        name = todo.popleft()
        if name in ancestors or not name:
            continue
        ancestors.add(name)
        node = g.producer.get(name)
        if node is not None:
            todo.extend(node.input)
    for node in g.graph.node:
        if node.op_type != "CumSum" or node.output[0] not in ancestors:
            continue
        source = g.producer.get(node.input[0])
        if source is not None and source.op_type == "Ceil":
            return str(source.output[0])
    return None


def find_split(model: onnx.ModelProto, split_at: SplitPoint = "flow") -> GraphSplit:
    """Locate the cut between sentence-level and frame-level parts of a VITS voice graph."""
    g = _Graph(model.graph)
    if len(model.graph.output) != 1:
        raise GraphShapeError(f"expected one waveform output, found {len(model.graph.output)}")
    output = model.graph.output[0].name
    dec_in = _decoder_input(g)
    _, frontier = g.closure(output, {dec_in})
    if frontier:
        raise GraphShapeError(f"the decoder reads more than its input: {sorted(frontier)[:3]}")
    if split_at == "decoder":
        readers = {"acoustic": g.reads_speaker(dec_in, set()),
                   "vocoder": g.reads_speaker(output, {dec_in})}  # fmt: skip
        return GraphSplit(tuple(g.inputs), dec_in, None, None, output, split_at,
                          frozenset(k for k, v in readers.items() if v),
                          _durations(g, dec_in))  # fmt: skip

    masked = g.producer.get(dec_in)
    if masked is None or masked.op_type != "Mul":
        raise GraphShapeError("the decoder input is not the masked flow output (z * y_mask)")
    # the mask is the operand shared by many frame ops; the flow output feeds only this Mul
    mask = max(masked.input, key=lambda name: len(g.consumers[name]))
    seen, _ = g.closure(dec_in, {mask})
    best: tuple[int, str] | None = None
    for cand in seen:
        if cand in (dec_in, mask) or cand in g.speaker:
            continue
        inner, frontier = g.closure(dec_in, {cand, mask})
        if not frontier and (best is None or len(inner) > best[0]):
            best = (len(inner), cand)
    if best is None:
        raise GraphShapeError("no single latent tensor feeds the flow: cannot split at the flow")
    latent = best[1]
    readers = {
        "acoustic": g.reads_speaker(latent, set()) or g.reads_speaker(mask, set()),
        "flow": g.reads_speaker(dec_in, {latent, mask}),
        "vocoder": g.reads_speaker(output, {dec_in}),
    }
    return GraphSplit(tuple(g.inputs), dec_in, latent, mask, output, split_at,
                      frozenset(k for k, v in readers.items() if v),
                      _durations(g, latent))  # fmt: skip


def extract(model: onnx.ModelProto, inputs: list[str], outputs: list[str]) -> onnx.ModelProto:
    """Extract the sub-graph between ``inputs`` and ``outputs`` as a standalone model."""
    extractor = onnx.utils.Extractor(model)
    sub: onnx.ModelProto = extractor.extract_model(inputs, outputs)
    sub.opset_import.clear()
    sub.opset_import.extend(model.opset_import)
    sub.ir_version = model.ir_version
    return sub


@dataclass(frozen=True)
class SplitEngines:
    """The engines a voice graph is cut into, with stable boundary tensor names.

    ``acoustic`` (sentence level): ids, lengths, scales → ``latents`` + ``mask`` (flow split) or
    → ``frames`` (decoder split), then ``durations`` (int32 ``[1, 1, N]``, frames per id) when the
    graph has them. ``flow`` (flow split only): ``latents`` + ``mask`` →
    ``frames``. ``vocoder``: ``frames`` → ``output`` waveform. Flow and vocoder are frame-local
    and run over windows; they are separate engines because their context needs differ: the
    flow is cheap with a wide receptive field, the decoder costly with a narrow one. In a
    multi-speaker voice each engine that reads the speaker also takes ``sid``
    (``split.speaker_readers``).
    """

    acoustic: onnx.ModelProto
    flow: onnx.ModelProto | None
    vocoder: onnx.ModelProto
    split: GraphSplit


def split_model(
    model: onnx.ModelProto,
    split_at: SplitPoint = "flow",
    voice_length_scale: float | None = None,
    pad_ids: Sequence[int] = PIPER_PAD_IDS,
) -> SplitEngines:
    """Cut ``model`` at ``split_at`` into sentence, flow and vocoder engines; each engine that
    reads the speaker takes ``sid`` as an input of its own.

    With ``voice_length_scale`` (the voice config's), the sentence engine's durations follow
    1/speed above speed 1 (``compile/speed.py``) where the graph allows; without it they are
    Piper's own. ``pad_ids`` are the voice's pad symbol's ids (``phoneme_id_map["_"]``, Piper's
    0 unless given), the only ids that may get no frame above speed ~2. ``model`` itself is
    left as it was.
    """
    split = find_split(model, split_at)
    if voice_length_scale is not None and split.durations is not None:
        rewritten = onnx.ModelProto()
        rewritten.CopyFrom(model)
        durations = follow_speed(rewritten, split.durations, voice_length_scale, pad_ids)
        if durations is not None:
            model = rewritten
            split = dataclasses.replace(split, durations=durations, follows_speed=True)
    model = onnx.shape_inference.infer_shapes(model)
    names = {split.decoder_input: "frames"}

    def inputs(engine: str, tensors: list[str]) -> list[str]:
        return [*tensors, SPEAKER_INPUT] if engine in split.speaker_readers else tensors

    sentence = [i for i in split.sentence_inputs if i != SPEAKER_INPUT]
    timed = [split.durations] if split.durations is not None else []
    if split.latent is not None and split.mask is not None:
        names |= {split.latent: "latents", split.mask: "mask"}
        acoustic = extract(model, inputs("acoustic", sentence), [split.latent, split.mask, *timed])
        flow: onnx.ModelProto | None = extract(
            model, inputs("flow", [split.latent, split.mask]), [split.decoder_input]
        )
    else:
        acoustic = extract(model, inputs("acoustic", sentence), [split.decoder_input, *timed])
        flow = None
    if split.durations is not None:
        _output_durations(acoustic, split.durations)
    vocoder = extract(model, inputs("vocoder", [split.decoder_input]), [split.output])
    for engine in (acoustic, flow, vocoder):
        if engine is not None:
            _rename(engine, names)
    return SplitEngines(acoustic, flow, vocoder, split)


DURATIONS = "durations"
"""The sentence engine's output of frames per input id (int32 ``[1, 1, N]``)."""


def _output_durations(acoustic: onnx.ModelProto, tensor: str) -> None:
    """Replace the float ``tensor`` output by its int32 copy named ``DURATIONS``.

    Integers because they are counts (and TensorRT takes int32 outputs as readily as ONNX
    Runtime); a cast of whole numbers below 2**24 is exact.
    """
    graph = acoustic.graph
    cast = onnx.helper.make_node("Cast", [tensor], [DURATIONS], to=onnx.TensorProto.INT32,
                                 name="durations_cast")  # fmt: skip
    graph.node.append(cast)
    kept = [out for out in graph.output if out.name != tensor]
    del graph.output[:]
    graph.output.extend(kept)
    graph.output.append(onnx.helper.make_tensor_value_info(DURATIONS, onnx.TensorProto.INT32,
                                                           [1, 1, "ids"]))  # fmt: skip


def _rename(model: onnx.ModelProto, names: dict[str, str]) -> None:
    """Give the boundary tensors stable names so runtimes need not know the voice's internals."""
    for value in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        if value.name in names:
            value.name = names[value.name]
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            if name in names:
                node.input[i] = names[name]
        for i, name in enumerate(node.output):
            if name in names:
                node.output[i] = names[name]


BATCH_AXIS = "batch"


def with_batch_axis(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of a frame engine whose inputs and outputs have a symbolic batch axis 0.

    Batching windows of several streams into one call needs axis 0 free. An exporter may have
    fixed it to 1 (or left per-tensor ``unk__`` names that a TensorRT profile cannot tie
    together); every window of a frame engine is independent along that axis (convolutions and
    element-wise ops only: ``FRAME_LOCAL_OPS``), so naming it one symbol is safe. Intermediate
    shape annotations are dropped because they may repeat the fixed 1; runtimes infer them again.
    """
    ops = {node.op_type for node in model.graph.node} - FRAME_LOCAL_OPS
    if ops:
        raise GraphShapeError(f"not a frame-local engine (has {sorted(ops)[:3]}): cannot batch it")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for value in [*out.graph.input, *out.graph.output]:
        dims = value.type.tensor_type.shape.dim
        if not dims:
            raise GraphShapeError(f"{value.name} has no shape: cannot give it a batch axis")
        dims[0].ClearField("dim_value")
        dims[0].dim_param = BATCH_AXIS
    del out.graph.value_info[:]
    return out
