"""A sentence's frame windows as engine calls: how flow and vocoder windows are cut and fed.

Why a module of its own: the synthesizer (``synthesizer.py``) says what to speak and turns
windows into chunks; how a sentence's latents become windows is a separate question with two
answers, one per kind of frame engine. Stateful engines (``compile/stateful.py``, the default)
carry each layer's state from one call to the next, so a window computes only its own frames
(``stateful_steps``); windowed (context) engines recompute a context on each side
(``window_steps``). A sentence that need not stream (its listener can wait for all of it) runs
whole on the plain graphs instead, one call per engine (``whole_steps``).

Why windows reproduce the one-shot audio exactly: flow and HiFi-GAN are pure convolution, so a
window's output depends only on a bounded neighbourhood of frames. Each context engine runs with
its own context of real frames on each side (measured at compile time and recorded in the
manifest) and its output is cropped to the window; a stateful engine's state stands in for the
frames before the window and its lag, flushed at the sentence's end, for those after.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar

import numpy as np

from ttsvc.backends.base import EngineSet, FloatArray, StreamCarry, StreamingEngine
from ttsvc.repository.manifest import FrameContext
from ttsvc.synthesis.steps import FrameCall, Steps
from ttsvc.windows import Budget, WindowSchedule

T = TypeVar("T")


class Framed(Protocol):
    """What cutting a sentence into engine calls reads of a synthesizer (the synthesizer imports
    this module, so it is described, not imported)."""

    engines: EngineSet
    stateful: bool
    vocoder_context: FrameContext
    flow_context: FrameContext | None
    hop: int
    flow_cost_s: float

    def plan(self, frames: int, schedule: WindowSchedule | None = None,
             budget: Budget | None = None) -> Iterator[tuple[int, int]]: ...  # fmt: skip

FLOW_CHUNK = 256
"""Most frames the flow runs ahead of the window it feeds: its context overhead stays small, and
one step stays short enough not to hold up other streams on the worker."""


def flow_ahead(end: int) -> int:
    """Frames the flow may run ahead of a window ending at frame ``end``: as many as the
    sentence has played up to it, at most ``FLOW_CHUNK``. The second window of a sentence
    follows a first chunk of 4-16 frames (46-186 ms of audio); a flow call that jumped 256
    frames there cost 33-60 ms with its window, longer than that audio lasts, and the stream
    ran dry (issue 37). Growing with the audio, the flow's run-ahead doubles from window to
    window and reaches ``FLOW_CHUNK`` within a few."""
    return min(FLOW_CHUNK, max(1, end))



def lag_context(engine: object) -> FrameContext:
    """A stateful engine's lag as the frames a first window reads past its end."""
    assert isinstance(engine, StreamingEngine)
    return FrameContext(left=0, right=engine.flush_frames, max_abs_error=0.0)


def padded(x: FloatArray, start: int, end: int) -> FloatArray:
    """Frames ``[start, end)`` of ``x``, zeros past its end (a stateful engine's flush)."""
    piece = x[:, :, start : min(end, x.shape[2])]
    if piece.shape[2] == end - start:
        return np.ascontiguousarray(piece)
    out = np.zeros((*x.shape[:2], end - start), dtype=np.float32)
    out[:, :, : piece.shape[2]] = piece
    return out



def _flow_chunk(synth: Framed, end: int, budget: Budget | None, context: int) -> int:
    """Frames the flow may run ahead for a window ending at ``end``: ``flow_ahead``'s, no more
    than the step ``budget`` allows at the flow's measured cost (``context``: frames each call
    recomputes beside its own, which the budget pays for too)."""
    chunk = flow_ahead(end)
    allowed = budget() if budget is not None and synth.flow_cost_s > 0 else None
    if allowed is not None:
        chunk = min(chunk, int(allowed / synth.flow_cost_s) - context)
    return chunk


def window_steps(
    synth: Framed,
    latents: FloatArray,
    schedule: WindowSchedule | None,
    finish: Callable[[int, int, FloatArray], T],
    budget: Budget | None = None,
    speaker: int = 0,
) -> Steps[T]:
    """Each window as ``finish(start, end, audio)``, asking for engine runs as ``FrameCall``s.

    Each vocoder window reads decoder frames with its own context on each side. Those frames
    come from the flow, run just far enough ahead (with the flow's own context) and kept, so
    each frame goes through the flow once: the first time only as far as the first window
    needs, later as far ahead as ``flow_ahead`` lets it (up to ``FLOW_CHUNK`` frames).

    The engine runs are yielded rather than made here so that a GPU scheduler can batch the
    same call of several streams (``worker.batching``); ``drive`` runs them one by one.
    ``budget`` (see ``WindowSchedule.windows``) bounds the flow's runs as well as the
    vocoder's windows: on a worker whose streams share its cores, the flow's chunk shrinks
    to what the budget allows (never below what the next window needs).
    """
    if synth.stateful:
        yield from stateful_steps(synth, latents, schedule, finish, budget, speaker)
        return
    total = latents.shape[2]
    vctx, hop = synth.vocoder_context, synth.hop
    flow, fctx = synth.engines.flow, synth.flow_context
    frames: FloatArray | None = latents if flow is None else None
    done = total if flow is None else 0
    for start, end in synth.plan(total, schedule, budget):
        need = min(total, end + vctx.right)
        if flow is not None and fctx is not None and done < need:
            chunk = _flow_chunk(synth, end, budget, fctx.left + fctx.right)
            target = need if done == 0 else min(total, max(need, done + chunk))
            lo, hi = max(0, done - fctx.left), min(total, target + fctx.right)
            out = yield FrameCall("flow", latents[:, :, lo:hi], speaker=speaker,
                                  window=end - start)  # fmt: skip
            assert isinstance(out, np.ndarray)
            piece = out[:, :, done - lo : target - lo]
            if frames is None:
                frames = np.empty((1, piece.shape[1], total), dtype=np.float32)
            frames[:, :, done:target] = piece
            done = target
        assert frames is not None
        lo, hi = max(0, start - vctx.left), min(total, end + vctx.right)
        audio = yield FrameCall("vocoder", frames[:, :, lo:hi], speaker=speaker)
        assert isinstance(audio, np.ndarray)
        yield finish(start, end, audio[(start - lo) * hop : (end - lo) * hop])


def stateful_steps(
    synth: Framed,
    latents: FloatArray,
    schedule: WindowSchedule | None,
    finish: Callable[[int, int, FloatArray], T],
    budget: Budget | None = None,
    speaker: int = 0,
) -> Steps[T]:
    """``window_steps`` on stateful engines: each frame goes through each engine once.

    The vocoder's output lags its input by ``lag`` samples, so a window ``[start, end)``
    feeds the vocoder up to ``end + flush`` frames (zeros past the sentence: the engine
    masks them), and those frames come from the flow, fed ``lag`` frames further still.
    Each engine's state for this sentence lives in its ``StreamCarry`` here, in the
    stream's own steps, and is dropped with them.
    """
    total = latents.shape[2]
    flow, vocoder = synth.engines.flow, synth.engines.vocoder
    assert isinstance(vocoder, StreamingEngine)
    hop, vflush = synth.hop, vocoder.flush_frames
    channels = latents.shape[1]
    vcarry, fcarry = StreamCarry(total), StreamCarry(total)
    frames = latents if flow is None else np.zeros((1, channels, total), np.float32)
    done = total if flow is None else 0  # decoder frames known
    audio = np.zeros(total * hop, np.float32)
    produced = 0  # samples of ``audio`` known
    for start, end in synth.plan(total, schedule, budget):
        need = min(total, end + vflush)
        if flow is not None and done < need:
            assert isinstance(flow, StreamingEngine)
            chunk = _flow_chunk(synth, end, budget, 0)
            target = need if done == 0 else min(total, max(need, done + chunk))
            fed = min(total + flow.lag, target + flow.lag)  # flow input frames wanted
            piece = padded(latents, fcarry.position, fed)
            out = yield FrameCall("flow", piece, speaker=speaker, carry=fcarry,
                                  window=end - start)  # fmt: skip
            assert isinstance(out, np.ndarray)
            first = fcarry.position - piece.shape[-1] - flow.lag  # sentence frame of out[0]
            lo, hi = max(0, first), min(total, first + out.shape[-1])
            frames[:, :, lo:hi] = out[:, :, lo - first : hi - first]
            done = hi
        fed = min(total + vflush, end + vflush)
        if vcarry.position < fed:
            piece = padded(frames, vcarry.position, fed)
            out = yield FrameCall("vocoder", piece, speaker=speaker, carry=vcarry)
            assert isinstance(out, np.ndarray)
            first = (vcarry.position - piece.shape[-1]) * hop - vocoder.lag
            lo, hi = max(0, first), min(total * hop, first + out.shape[-1])
            audio[lo:hi] = out[lo - first : hi - first]
            produced = hi
        assert produced >= end * hop
        yield finish(start, end, audio[start * hop : end * hop])



def whole_steps(
    synth: Framed,
    latents: FloatArray,
    finish: Callable[[int, int, FloatArray], T],
    speaker: int = 0,
) -> Steps[T]:
    """The sentence as one window: the flow and the vocoder once each on the engine set's plain
    graphs (``EngineSet.one_shot``), its audio one ``finish(0, total, audio)``.

    Why: on the default (stateful) engines a whole sentence costs what its windows do, since a
    stateful graph pays for its state on every frame; the plain graphs compute it from zero
    padding alone, about three quarters of that (``docs/decisions.md``). It is the one-shot
    output, which streamed output equals. Only for a sentence whose listener can wait for its
    end: its first audio comes with its last."""
    total = latents.shape[2]
    frames = latents
    if synth.engines.flow is not None:
        out = yield FrameCall("flow", latents, speaker=speaker, window=total, plain=True)
        assert isinstance(out, np.ndarray)
        frames = out
    audio = yield FrameCall("vocoder", frames, speaker=speaker, plain=True)
    assert isinstance(audio, np.ndarray)
    yield finish(0, total, audio.reshape(-1)[: total * synth.hop])
