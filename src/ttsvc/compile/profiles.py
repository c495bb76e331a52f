"""TensorRT optimization profiles: the input shapes each plan must accept, from the compile flags.

Pure arithmetic, no TensorRT: a plan rejects any shape outside its profile at run time, so the
bounds must cover every call the streaming synthesizer can make, and they follow from the same
window schedule and calibrated contexts the synthesizer uses:

* **acoustic** (once per sentence, never batched across streams): ids ``[1, 1..seq_len]``; the
  optimum is a typical sentence (Piper interleaves a pad id after every phoneme, so a 60-character
  sentence is ~120 ids);
* **flow** and **vocoder** (frame windows, batched across streams): ``[1..max_batch, C, T]`` where
  ``T`` runs from one frame (the tail of a very short sentence) to the widest window the schedule
  makes (its ``max``, plus the half-window a merged tail may add, plus the engine's context on
  both sides; the flow also runs up to ``FLOW_CHUNK`` frames ahead). Calls wider than that (a
  one-shot canary of a long sentence) are cut into windows by the engine itself
  (``run_in_windows``), so the profile need not cover whole sentences. The optimum is the second
  window of the schedule at half the batch: the steady state of a loaded worker.
"""

from __future__ import annotations

from dataclasses import dataclass

from ttsvc.errors import InvalidParameter
from ttsvc.repository.manifest import FrameContext
from ttsvc.synthesis import FLOW_CHUNK
from ttsvc.windows import WindowSchedule

MAX_BATCH_LIMIT = 64
"""Beyond this a profile's largest activations (batch x 200k samples x 32 channels) stop fitting
comfortably beside other engines on a 24 GB card."""
MIN_SEQ_LEN = 16
TYPICAL_IDS = 128
"""Optimum ids per sentence for the acoustic plan (a ~60-character sentence)."""

Shape = tuple[int, ...]


@dataclass(frozen=True)
class TensorProfile:
    """Min / opt / max shape of one input tensor of a plan."""

    name: str
    min: Shape
    opt: Shape
    max: Shape

    def covers(self, shape: Shape) -> bool:
        """Whether a call with ``shape`` is inside this profile."""
        return len(shape) == len(self.min) and all(
            lo <= d <= hi for lo, d, hi in zip(self.min, shape, self.max, strict=True)
        )

    def as_lists(self) -> list[list[int]]:
        """``[min, opt, max]`` for the manifest."""
        return [list(self.min), list(self.opt), list(self.max)]


def widest_window(schedule: WindowSchedule) -> int:
    """The most frames one window of ``schedule`` can hold: ``max`` plus a merged tail.

    ``WindowSchedule.windows`` merges a tail shorter than half the next window into the window
    before it, so a window may reach ``max + max // 2`` frames.
    """
    return schedule.max + schedule.max // 2


def check_limits(max_batch: int, seq_len: int) -> None:
    """Refuse flags no useful plan can have."""
    if not 1 <= max_batch <= MAX_BATCH_LIMIT:
        raise InvalidParameter(
            f"--max-batch must be 1..{MAX_BATCH_LIMIT}, got {max_batch}", field="max_batch"
        )
    if seq_len < MIN_SEQ_LEN:
        raise InvalidParameter(
            f"--seq-len must be at least {MIN_SEQ_LEN} phoneme ids, got {seq_len}", field="seq_len"
        )


def engine_profiles(
    *,
    max_batch: int,
    seq_len: int,
    schedule: WindowSchedule,
    contexts: dict[str, FrameContext],
    channels: int,
) -> dict[str, list[TensorProfile]]:
    """Profiles of the ``acoustic``, ``flow`` (when ``contexts`` has one) and ``vocoder`` plans."""
    check_limits(max_batch, seq_len)
    opt_batch = max(1, max_batch // 2)
    steady = min(schedule.max, max(schedule.first + 1, int(schedule.first * schedule.growth)))
    widest = widest_window(schedule)
    vctx = contexts["vocoder"]
    vspan = vctx.left + vctx.right
    profiles = {
        "acoustic": [
            TensorProfile("input", (1, 1), (1, min(seq_len, TYPICAL_IDS)), (1, seq_len)),
            TensorProfile("input_lengths", (1,), (1,), (1,)),
            TensorProfile("scales", (3,), (3,), (3,)),
        ],
        "vocoder": [
            TensorProfile(
                "frames",
                (1, channels, 1),
                (opt_batch, channels, steady + vspan),
                (max_batch, channels, widest + vspan),
            )
        ],
    }
    fctx = contexts.get("flow")
    if fctx is not None:
        # one flow call covers the frames the next vocoder window needs (its right context
        # included) or up to FLOW_CHUNK frames ahead, whichever is more, plus its own context
        fspan = fctx.left + fctx.right
        fmax = max(widest + vctx.right, FLOW_CHUNK) + fspan
        fopt = max(steady, FLOW_CHUNK) + fspan
        profiles["flow"] = [
            TensorProfile(
                name,
                (1, width, 1),
                (opt_batch, width, fopt),
                (max_batch, width, fmax),
            )
            for name, width in (("latents", channels), ("mask", 1))
        ]
    return profiles


def max_frames(profiles: list[TensorProfile]) -> int:
    """The widest window (last axis) a frame plan accepts: calls beyond it are cut into windows."""
    return min(p.max[-1] for p in profiles)
