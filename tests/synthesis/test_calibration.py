"""What the engines cost here, as a worker measures it at start (``synthesis.calibration``):
every figure the scheduler prices steps with is set, on both kinds of frame engines, and the
audio per phoneme id is the canary's own."""

from __future__ import annotations

from ttsvc.synthesis import CANARY_TEXT, SynthesisParams, Synthesizer
from ttsvc.synthesis.calibration import measure_seconds_per_id


def test_stateful_engines_get_per_frame_and_per_call_costs(synth: Synthesizer) -> None:
    fresh = Synthesizer(synth.engines)
    assert fresh.frame_cost_s == 0.0  # no playback cap until measured
    per_frame = fresh.calibrate()
    assert per_frame == fresh.frame_cost_s == fresh.flow_cost_s + fresh.vocoder_cost_s > 0
    assert fresh.flow_cost_s > 0 and fresh.vocoder_cost_s > 0 and fresh.acoustic_cost_s > 0
    assert fresh.flow_call_s >= 0 and fresh.vocoder_call_s >= 0


def test_context_engines_get_per_frame_costs_and_no_call_costs(
    context_synth: Synthesizer,
) -> None:
    fresh = Synthesizer(context_synth.engines)
    assert fresh.calibrate() == fresh.flow_cost_s + fresh.vocoder_cost_s > 0
    assert fresh.flow_call_s == fresh.vocoder_call_s == 0.0  # a window's cost includes its call


def test_seconds_per_id_is_the_canarys_audio_over_its_ids(synth: Synthesizer) -> None:
    params = SynthesisParams(noise_scale=0.0, noise_w=0.0)
    sentences = synth.sentences(CANARY_TEXT)
    frames = sum(synth.latents(s.ids, params).shape[2] for s in sentences)
    ids = sum(len(s.ids) for s in sentences)
    expected = frames * synth.hop / synth.sample_rate / ids
    assert measure_seconds_per_id(synth) == expected
    fresh = Synthesizer(synth.engines)
    assert fresh.seconds_per_id() == expected  # measured once, then kept
    assert fresh.seconds_per_id() is fresh.seconds_per_id()
