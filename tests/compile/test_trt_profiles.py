"""TensorRT profile shapes from the compile flags and the streaming schedule (no GPU needed)."""

from __future__ import annotations

import pytest

from ttsvc.compile.profiles import TensorProfile, engine_profiles, max_frames, widest_window
from ttsvc.errors import InvalidParameter
from ttsvc.repository.manifest import FrameContext
from ttsvc.synthesis import FrameCall, SynthesisParams, Synthesizer
from ttsvc.windows import WindowSchedule

CONTEXTS = {
    "flow": FrameContext(left=32, right=32, max_abs_error=0.0),
    "vocoder": FrameContext(left=16, right=16, max_abs_error=0.0),
}


def _profiles(**kw: object) -> dict[str, list[TensorProfile]]:
    args: dict[str, object] = {"max_batch": 8, "seq_len": 512, "schedule": WindowSchedule(first=8),
                               "contexts": CONTEXTS, "channels": 192}  # fmt: skip
    args.update(kw)
    return engine_profiles(**args)  # type: ignore[arg-type]


def test_shapes_from_the_flags_and_an_8_frame_first_window() -> None:
    profiles = _profiles()
    assert set(profiles) == {"acoustic", "flow", "vocoder"}
    ids = {p.name: p for p in profiles["acoustic"]}
    assert (ids["input"].min, ids["input"].opt, ids["input"].max) == ((1, 1), (1, 128), (1, 512))
    assert ids["scales"].max == (3,)
    (frames,) = profiles["vocoder"]
    # 8-frame first window grown 8x = 64 at the optimum; 512 + a merged tail of 256 at most;
    # plus 16 + 16 frames of vocoder context; batch 1..8, optimum half of it
    assert (frames.min, frames.opt, frames.max) == ((1, 192, 1), (4, 192, 96), (8, 192, 800))
    latents, mask = profiles["flow"]
    assert (latents.name, mask.name) == ("latents", "mask")
    # the flow advances by >= 256 frames (FLOW_CHUNK) or a whole window + its right context
    assert latents.max == (8, 192, 768 + 16 + 64) and mask.max == (8, 1, 768 + 16 + 64)
    assert latents.opt == (4, 192, 256 + 64)
    assert max_frames(profiles["flow"]) == 848


def test_flags_change_the_shapes() -> None:
    small = _profiles(max_batch=1, seq_len=64, schedule=WindowSchedule(16, 4.0, 128))
    (frames,) = small["vocoder"]
    assert frames.max == (1, 192, 128 + 64 + 32) and frames.opt == (1, 192, 64 + 32)
    assert small["acoustic"][0].max == (1, 64) and small["acoustic"][0].opt == (1, 64)
    assert widest_window(WindowSchedule(16, 4.0, 128)) == 192


def test_decoder_split_has_no_flow_profile() -> None:
    assert "flow" not in _profiles(contexts={"vocoder": CONTEXTS["vocoder"]})


@pytest.mark.parametrize(("kw", "field"), [({"max_batch": 0}, "max_batch"),
                                           ({"max_batch": 65}, "max_batch"),
                                           ({"seq_len": 4}, "seq_len")])  # fmt: skip
def test_unusable_flags_are_refused(kw: dict[str, int], field: str) -> None:
    with pytest.raises(InvalidParameter) as err:
        _profiles(**kw)
    assert err.value.field == field


def test_covers() -> None:
    p = TensorProfile("frames", (1, 192, 1), (4, 192, 96), (8, 192, 800))
    assert p.covers((1, 192, 1)) and p.covers((8, 192, 800))
    assert not p.covers((9, 192, 10)) and not p.covers((1, 192, 801))
    assert not p.covers((1, 192)) and not p.covers((1, 80, 10))


@pytest.mark.parametrize("calibrated", [False, True])
def test_every_call_the_synthesizer_makes_is_inside_the_profiles(
    synth: Synthesizer, calibrated: bool
) -> None:
    """The profiles are derived, not guessed: run the real streaming path (with and without the
    playback cap) over short and long sentences and check every engine call fits, at batch 1
    and at the largest batch."""
    schedule = synth.schedule
    manifest = synth.engines.manifest
    profiles = engine_profiles(max_batch=8, seq_len=512, schedule=schedule,
                               contexts=manifest.contexts,
                               channels=manifest.latent_channels)  # fmt: skip
    local = Synthesizer(synth.engines, schedule)
    if calibrated:
        local.frame_cost_s = 1e-4  # a fast machine: windows grow to the maximum quickly
    texts = [
        "Hi.",
        "The quick brown fox jumps over the lazy dog.",
        "When the sunlight strikes raindrops in the air, they act as a prism and form a "
        "rainbow, a division of white light into many beautiful colors that take the shape "
        "of a long round arch, with its path high above.",
    ]
    params = SynthesisParams(noise_scale=0.0, noise_w=0.0, speed=0.5)  # long: more frames
    seen = 0
    for text in texts:
        steps = local.stream_steps(text, params)
        answer = None
        for _ in range(10_000):
            try:
                item = steps.send(answer)
            except StopIteration:
                break
            answer = None
            if isinstance(item, FrameCall):
                seen += 1
                shape = item.inputs.shape
                for profile in profiles[item.stage][:1]:
                    assert profile.covers(shape), (item.stage, shape, profile)
                    if item.stage != "acoustic":  # once per sentence: it never batches
                        assert profile.covers((8, *shape[1:]))
                answer = local.run_call(item)
    for sentence in local.sentences(texts[-1]):
        assert len(sentence.ids) <= 512
    assert seen > 10
