"""ONNX Runtime on CPU: the embedded default backend.

Sessions are created once per engine version per process (creation costs tens of milliseconds
even from pre-optimized graphs). Engines are verified against their manifest before ONNX Runtime
sees a byte of them, so a truncated or altered file is refused with a message naming it.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnxruntime as ort

from ttsvc.backends.base import (
    DURATIONS_OUTPUT,
    POSITION_INPUT,
    SPEAKER_INPUT,
    STATE_IN,
    STREAM_LAG_KEY,
    STREAM_SCALE_KEY,
    TOTAL_INPUT,
    EngineSet,
    EngineSource,
    FloatArray,
    IntArray,
    PlainFrames,
    SentenceRun,
    StreamCarry,
)
from ttsvc.errors import EngineError
from ttsvc.repository.manifest import Manifest, cpu_fingerprint
from ttsvc.voice import VOICE_FILE, VoiceConfig

ACOUSTIC_FILE = "acoustic.onnx"
FLOW_FILE = "flow.onnx"
VOCODER_FILE = "vocoder.onnx"
PLAIN_FLOW_FILE = "flow_plain.onnx"
"""The flow as a plain graph, beside a stateful ``flow.onnx`` (``EngineSet.plain``)."""
PLAIN_VOCODER_FILE = "vocoder_plain.onnx"
"""The vocoder as a plain graph, beside a stateful ``vocoder.onnx``."""


def session_options(threads: int, optimize: bool = False) -> ort.SessionOptions:
    """Options for a worker's sessions.

    One intra-op thread by default: a worker process is the unit of parallelism, and extra
    threads per worker fight each other on a small machine. Graphs were fully optimized at compile
    time for this machine kind (see ``runtime_fingerprint``), so the optimizer stays off at load.
    """
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if optimize
        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    opts.log_severity_level = 3
    if threads == 1:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    CPU_ARENA.register()
    opts.add_session_config_entry("session.use_env_allocators", "1")
    return opts


class _CpuArena:
    """One CPU memory arena for every session of the process, registered on first use.

    A hot swap replaces sessions; with an arena each, every new session grows its own while the
    old one's freed blocks stay behind in the C heap, and a worker's memory creeps up swap after
    swap (measured with the blocked-layout engines of ``compile/layout.py``). Sessions that
    draw from one arena reuse what the swapped-out ones gave back.

    The arena keeps every region it ever grew to (a swap runs two engine sets' streams and
    canaries side by side), so ``shrink`` hands the wholly free regions back: ONNX Runtime does
    that only at the end of a run that asks for it, hence a one-node session of its own."""

    def __init__(self) -> None:
        self.registered = False
        self._shrinker: tuple[ort.InferenceSession, ort.RunOptions] | None = None

    def register(self) -> None:
        if self.registered:
            return
        info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0,
                                 ort.OrtMemType.DEFAULT)  # fmt: skip
        ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, -1, -1, -1))
        self.registered = True

    def prepare(self) -> None:
        """Build the one-node session ``shrink`` runs. A worker calls it at start, before it
        says it is ready: built at the first idle shrink instead, its import of ``onnx`` held
        the worker's main thread for over 10 s on a 2-core machine whose cores another server
        kept busy, its heartbeats stopped, and the gateway killed it as hung (seed benchmark,
        closed loop of 32 beside Piper's server)."""
        if self._shrinker is None:
            from onnx import TensorProto, helper  # noqa: PLC0415 - once, at a worker's start

            node = helper.make_node("Identity", ["x"], ["y"])
            value = helper.make_tensor_value_info
            graph = helper.make_graph([node], "shrink", [value("x", TensorProto.FLOAT, [1])],
                                      [value("y", TensorProto.FLOAT, [1])])  # fmt: skip
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                                      ir_version=7)  # fmt: skip
            run_options = ort.RunOptions()
            run_options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
            session = ort.InferenceSession(model.SerializeToString(), session_options(1),
                                           providers=["CPUExecutionProvider"])  # fmt: skip
            self._shrinker = (session, run_options)

    def shrink(self) -> bool:
        """Release the arena's free regions to the OS; False if no session ever used it.
        Call while idle: the next runs grow it again, a page fault at a time."""
        if not self.registered:
            return False
        self.prepare()  # at once where the worker prepared it at start
        assert self._shrinker is not None
        session, run_options = self._shrinker
        session.run(None, {"x": np.zeros(1, np.float32)}, run_options)
        return True


CPU_ARENA = _CpuArena()
"""The process's shared CPU arena (see ``session_options``)."""


def create_session(
    path: Path, threads: int, verified: BinaryIO | None = None, optimize: bool = False
) -> ort.InferenceSession:
    """Create a CPU session (from ``verified``, a handle whose content was checked, when given,
    else from ``path``); ONNX Runtime's failures become an engine error naming the file.
    ``optimize`` is for graphs not optimized at compile time (the compiler's own checks)."""
    try:
        return ort.InferenceSession(
            str(path) if verified is None else _parse_source(verified),
            session_options(threads, optimize),
            providers=["CPUExecutionProvider"],
        )
    except Exception as exc:  # ORT raises its own untyped exceptions for bad graphs
        raise EngineError(f"{path}: ONNX Runtime could not load it: {exc}", file=path.name,
                          reason="ONNX Runtime could not load it") from exc  # fmt: skip


def _parse_source(handle: BinaryIO) -> str | bytes:
    """What ONNX Runtime should parse for an open, verified file.

    Its ``/proc/self/fd`` path where there is one: ORT reads the very file that was hashed, and
    no Python copy of the model stays beside ORT's own (measured: 63 MB less per worker for the
    default voice). Elsewhere the bytes, read from the same handle.
    """
    fd_path = Path(f"/proc/self/fd/{handle.fileno()}")
    return str(fd_path) if fd_path.exists() else handle.read()


class _SpeakerFeed:
    """Adds the speaker id to an engine's feed where its graph takes one (``sid``: engines of
    a multi-speaker voice that read the speaker); other engines are fed as before. The speaker
    was checked against the voice by the synthesizer: an engine that does not read it (a
    single-speaker voice, or a part a voice does not condition) has nothing to check."""

    def __init__(self, session: ort.InferenceSession) -> None:
        self._takes_speaker = SPEAKER_INPUT in {i.name for i in session.get_inputs()}

    def feed(self, feed: dict[str, np.ndarray], speaker: int) -> dict[str, np.ndarray]:
        if self._takes_speaker:
            feed[SPEAKER_INPUT] = np.array([speaker], dtype=np.int64)
        return feed


class OrtAcoustic(_SpeakerFeed):
    """Sentence engine on an ONNX Runtime session; lives in a worker's compute thread."""

    def __init__(self, session: ort.InferenceSession) -> None:
        super().__init__(session)
        self._session = session
        self._output = session.get_outputs()[0].name  # "latents", or "frames" without a flow
        names = {o.name for o in session.get_outputs()}
        # engines compiled before durations were an output still serve, without timestamps
        self._outputs = [self._output, *([DURATIONS_OUTPUT] if DURATIONS_OUTPUT in names else [])]

    def latents(self, ids: IntArray, scales: FloatArray, speaker: int = 0) -> FloatArray:
        lengths = np.array([ids.shape[1]], dtype=np.int64)
        feed = self.feed({"input": ids, "input_lengths": lengths, "scales": scales}, speaker)
        out = self._session.run([self._output], feed)
        return np.asarray(out[0], dtype=np.float32)

    def run(self, ids: IntArray, scales: FloatArray, speaker: int = 0) -> SentenceRun:
        lengths = np.array([ids.shape[1]], dtype=np.int64)
        feed = self.feed({"input": ids, "input_lengths": lengths, "scales": scales}, speaker)
        out = self._session.run(self._outputs, feed)
        durations = np.asarray(out[1], dtype=np.int64).reshape(-1) if len(out) > 1 else None
        return SentenceRun(np.asarray(out[0], dtype=np.float32), durations)


class OrtFlow(_SpeakerFeed):
    """Flow engine on an ONNX Runtime session; lives in a worker's compute thread."""

    def __init__(self, session: ort.InferenceSession) -> None:
        super().__init__(session)
        self._session = session

    def frames(self, latents: FloatArray, speaker: int = 0) -> FloatArray:
        # batch 1: every frame of a window is a real frame, so the mask is all ones
        mask = np.ones((1, 1, latents.shape[2]), dtype=np.float32)
        feed = self.feed({"latents": np.ascontiguousarray(latents), "mask": mask}, speaker)
        out = self._session.run(None, feed)
        return np.asarray(out[0], dtype=np.float32)


class OrtVocoder(_SpeakerFeed):
    """Vocoder engine on an ONNX Runtime session; lives in a worker's compute thread."""

    def __init__(self, session: ort.InferenceSession) -> None:
        super().__init__(session)
        self._session = session

    def waveform(self, frames: FloatArray, speaker: int = 0) -> FloatArray:
        out = self._session.run(None, self.feed({"frames": np.ascontiguousarray(frames)}, speaker))
        return np.asarray(out[0], dtype=np.float32).reshape(-1)


def is_stateful(session: ort.InferenceSession) -> bool:
    """Whether a frame engine's graph is the stateful streaming form (it takes a position)."""
    return POSITION_INPUT in {i.name for i in session.get_inputs()}


class _OrtStreaming(_SpeakerFeed):
    """A stateful frame engine (``compile/stateful.py``) on an ONNX Runtime session.

    ``step`` feeds the stream's state and keeps what comes back in the stream's ``StreamCarry``;
    the one-shot calls (``frames``, ``waveform``: canary, calibration, whole sentences) run the
    sentence and its flush in one call from a zero state, which is the one-shot graph's result.
    """

    def __init__(self, session: ort.InferenceSession, data: str) -> None:
        super().__init__(session)
        self._session = session
        meta = session.get_modelmeta().custom_metadata_map
        self.lag = int(meta[STREAM_LAG_KEY])
        self.scale = int(meta[STREAM_SCALE_KEY])
        self._data = data
        self._states = [i for i in session.get_inputs() if i.name.startswith(STATE_IN)]
        self._outputs = [o.name for o in session.get_outputs()]

    @property
    def flush_frames(self) -> int:
        return -(-self.lag // self.scale)

    def _feed(self, inputs: FloatArray, carry: StreamCarry) -> dict[str, np.ndarray]:
        return {self._data: np.ascontiguousarray(inputs, dtype=np.float32)}

    def step(self, inputs: FloatArray, carry: StreamCarry, speaker: int = 0) -> FloatArray:
        feed = self.feed(self._feed(inputs, carry), speaker)
        feed[POSITION_INPUT] = np.array([carry.position], dtype=np.int64)
        feed[TOTAL_INPUT] = np.array([carry.total], dtype=np.int64)
        states = carry.states
        if states is None:
            batch = inputs.shape[0]
            states = [np.zeros((batch, int(i.shape[1]), int(i.shape[2])), np.float32)
                      for i in self._states]  # fmt: skip
        feed.update(zip((i.name for i in self._states), states, strict=True))
        out = self._session.run(self._outputs, feed)
        carry.states = [np.asarray(x) for x in out[1:]]
        carry.position += inputs.shape[-1]
        return np.asarray(out[0], dtype=np.float32)

    def _one_shot(self, x: FloatArray, speaker: int) -> FloatArray:
        total = x.shape[-1]
        flush = np.zeros((*x.shape[:-1], self.flush_frames), dtype=np.float32)
        out = self.step(np.concatenate([x, flush], axis=-1), StreamCarry(total), speaker)
        return out[..., self.lag : self.lag + total * self.scale]


class OrtStreamingFlow(_OrtStreaming):
    """The stateful flow: the frame mask is one inside the sentence, zero in its flush."""

    def __init__(self, session: ort.InferenceSession) -> None:
        super().__init__(session, "latents")

    def _feed(self, inputs: FloatArray, carry: StreamCarry) -> dict[str, np.ndarray]:
        width = inputs.shape[-1]
        inside = np.clip(carry.total - carry.position, 0, width)
        mask = np.zeros((inputs.shape[0], 1, width), dtype=np.float32)
        mask[..., :inside] = 1.0
        return {"latents": np.ascontiguousarray(inputs, dtype=np.float32), "mask": mask}

    def frames(self, latents: FloatArray, speaker: int = 0) -> FloatArray:
        return self._one_shot(latents, speaker)


class OrtStreamingVocoder(_OrtStreaming):
    """The stateful vocoder: frames in, flat samples out."""

    def __init__(self, session: ort.InferenceSession) -> None:
        super().__init__(session, "frames")

    def step(self, inputs: FloatArray, carry: StreamCarry, speaker: int = 0) -> FloatArray:
        return super().step(inputs, carry, speaker).reshape(-1)

    def waveform(self, frames: FloatArray, speaker: int = 0) -> FloatArray:
        return self._one_shot(frames, speaker)


def flow_engine(session: ort.InferenceSession) -> OrtFlow | OrtStreamingFlow:
    """The flow class for a loaded graph: stateful or windowed (context) engines."""
    return OrtStreamingFlow(session) if is_stateful(session) else OrtFlow(session)


def vocoder_engine(session: ort.InferenceSession) -> OrtVocoder | OrtStreamingVocoder:
    """The vocoder class for a loaded graph: stateful or windowed (context) engines."""
    return OrtStreamingVocoder(session) if is_stateful(session) else OrtVocoder(session)


QUANTIZED_OPS = frozenset({
    "MatMulInteger", "ConvInteger", "DynamicQuantizeLinear", "QuantizeLinear",
    "DequantizeLinear", "QLinearConv", "QLinearMatMul",
})  # fmt: skip
"""Operators only a quantized graph has (``quantize_dynamic`` and static quantization)."""


def graph_precision(handle: BinaryIO) -> str:
    """The precision a graph really computes in, from its operators and weight types.

    For a file replaced in place, whose manifest entry no longer describes it. Parsed here in
    the worker, from the verified handle, after ONNX Runtime accepted the same bytes; only the
    graph's structure is looked at, and it is dropped at once.
    """
    import onnx  # noqa: PLC0415 - only for files replaced in place; workers rarely need it

    model = onnx.load_model(handle, load_external_data=False)
    weights = {init.data_type for init in model.graph.initializer}
    ops = {node.op_type for node in model.graph.node}
    del model
    if ops & QUANTIZED_OPS or weights & {onnx.TensorProto.INT8, onnx.TensorProto.UINT8}:
        return "int8"
    if onnx.TensorProto.FLOAT16 in weights:
        return "fp16"
    return "fp32"


def runtime_fingerprint() -> dict[str, str]:
    """What a fully optimized ONNX Runtime graph is specific to: runtime version and CPU."""
    return {"onnxruntime": ort.__version__, **cpu_fingerprint()}


def check_fingerprint(directory: Path, manifest: Manifest) -> None:
    """Refuse engines optimized for another architecture or ONNX Runtime release.

    Layout-optimized graphs can reference kernels that exist only there; failing here names the
    cause instead of failing inside ONNX Runtime.
    """
    here = runtime_fingerprint()
    built = manifest.runtime
    release = ".".join(here["onnxruntime"].split(".")[:2])
    if built.get("machine") != here["machine"] or not built.get("onnxruntime", "").startswith(
        release
    ):
        raise EngineError(
            f"{directory}: built for {built.get('machine')} / onnxruntime "
            f"{built.get('onnxruntime')}, this is {here['machine']} / onnxruntime "
            f"{here['onnxruntime']}: recompile on this machine with "
            f"`ttsvc compile --checkpoint <voice.onnx> --voice {manifest.voice}`",
            file="manifest.json",
            reason="built for another machine or ONNX Runtime release: recompile it here",
        )


def assemble(source: EngineSource, threads: int) -> EngineSet:
    """Check compatibility, then parse each engine from a handle whose content was just checked."""
    manifest, directory = source.manifest, source.directory
    if manifest.backend != "ort":
        raise EngineError(f"{directory}: built for backend {manifest.backend!r}, not 'ort'")
    check_fingerprint(directory, manifest)
    for name in (ACOUSTIC_FILE, VOCODER_FILE, VOICE_FILE):
        if name not in manifest.files:
            raise EngineError(f"{directory}: manifest does not list {name}")
    voice = VoiceConfig.from_piper(json.loads(source.read(VOICE_FILE).decode("utf-8")),
                                  manifest.voice)

    def load(name: str) -> tuple[ort.InferenceSession, str | None]:
        with source.open_file(name) as handle:
            session = create_session(directory / name, threads, handle)
            if name not in source.replaced:
                return session, None  # the manifest, which its hash matched, says the precision
            handle.seek(0)
            return session, graph_precision(handle)

    names = [n for n in (ACOUSTIC_FILE, VOCODER_FILE, FLOW_FILE, PLAIN_VOCODER_FILE,
                         PLAIN_FLOW_FILE) if n in manifest.files]  # fmt: skip
    # hashing and session creation release the GIL: the engines load side by side
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="engine-load") as pool:
        loaded = dict(zip(names, pool.map(load, names), strict=True))
    sessions = {name: session for name, (session, _) in loaded.items()}
    measured = {Path(n).stem: p for n, (_, p) in loaded.items() if p is not None}
    flow, plain_flow = sessions.get(FLOW_FILE), sessions.get(PLAIN_FLOW_FILE)
    plain_vocoder = sessions.get(PLAIN_VOCODER_FILE)
    plain = None
    if plain_vocoder is not None and (plain_flow is None) == (flow is None):
        plain = PlainFrames(OrtFlow(plain_flow) if plain_flow is not None else None,
                            OrtVocoder(plain_vocoder))  # fmt: skip
    return EngineSet(
        acoustic=OrtAcoustic(sessions[ACOUSTIC_FILE]),
        flow=flow_engine(flow) if flow is not None else None,
        vocoder=vocoder_engine(sessions[VOCODER_FILE]),
        manifest=manifest,
        voice=voice,
        path=directory,
        label=source.label,
        measured_precision=measured,
        plain=plain,
    )
