"""How each ONNX Runtime engine file is made: optimized offline, in the faster convolution layout,
and quantized to int8 where the quality check against the fp32 reference passes.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import onnxruntime as ort

from ttsvc.backends.onnxruntime import PLAIN_FLOW_FILE, PLAIN_VOCODER_FILE
from ttsvc.compile.layout import (
    CONV1D,
    CONV2D,
    KEEP_LIFTED,
    lift_convolutions,
    speedup,
    timing_feeds,
)
from ttsvc.compile.reference import Chain, Reference, snr_db

PLAIN_FILES = frozenset({PLAIN_FLOW_FILE, PLAIN_VOCODER_FILE})


def optimize(model: onnx.ModelProto, dst: Path) -> None:
    """Save the graph as ONNX Runtime's full optimizer leaves it, so loading skips optimizing.

    Measured: session creation from the unsplit graph took 374-400 ms; from graphs optimized here
    and loaded with optimization off, well under 100 ms per engine set. The full level includes
    layout passes specific to the CPU architecture, so, like a TensorRT plan, an engine set is
    built for the machine kind it serves on: the manifest records that fingerprint and the loader
    refuses a mismatch with a message to recompile.
    """
    raw = dst.with_suffix(".raw.onnx")
    onnx.save(model, raw)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.optimized_model_filepath = str(dst)
    opts.log_severity_level = 3
    ort.InferenceSession(str(raw), opts, providers=["CPUExecutionProvider"])
    raw.unlink()


def optimize_fastest(
    model: onnx.ModelProto, dst: Path, ids: list[int], lift: bool
) -> tuple[str, float]:
    """Optimize ``model`` into ``dst`` in the faster of its two convolution layouts (see
    ``layout.py``), timed side by side on this machine; returns the layout kept and the lifted
    layout's speedup (1.0 when not tried).

    Measured rather than fixed because the gain depends on the engine: the blocked 2-D kernels
    win on wide convolutions, but an engine that slices channels between its convolutions
    (a flow's coupling layers) pays a layout conversion at every slice.
    """
    optimize(model, dst)
    lifted, convs = lift_convolutions(model) if lift else (model, 0)
    if not convs:
        return CONV1D, 1.0
    candidate = dst.with_suffix(".2d.onnx")
    optimize(lifted, candidate)
    gain = speedup(dst, candidate, timing_feeds(model, ids))
    if gain >= KEEP_LIFTED:
        candidate.replace(dst)
        return CONV2D, gain
    candidate.unlink()
    return CONV1D, gain


def _quantize_int8(src: Path, dst: Path) -> None:
    """Dynamic int8 quantization of weights (activations quantized per call, not calibrated)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic  # noqa: PLC0415

    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)


def try_int8(staging: Path, filename: str, reference: Reference, min_snr_db: float) -> float:
    """Quantize one engine in place if it keeps ``min_snr_db`` against fp32; return the SNR."""
    path = staging / filename
    candidate = path.with_suffix(".int8.onnx")
    _quantize_int8(path, candidate)
    chain = Chain(staging, {filename: candidate}, plain=filename in PLAIN_FILES)
    worst = float("inf")
    for ids, speaker, expected in zip(reference.ids, reference.speakers, reference.audio,
                                      strict=True):  # fmt: skip
        got = chain.run(ids, speaker, reference.length_scale)[2]
        worst = min(worst, snr_db(expected, got) if got.shape == expected.shape else -1.0)
    if worst >= min_snr_db:
        candidate.replace(path)
    else:
        candidate.unlink()
    return worst
