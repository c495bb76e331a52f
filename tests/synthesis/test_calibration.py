"""What the engines cost here, as a worker measures it at start (``synthesis.calibration``):
every figure the scheduler prices steps with is set, on both kinds of frame engines, and the
audio per phoneme id is the canary's own."""

from __future__ import annotations

import dataclasses

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


def test_the_plain_graphs_get_whole_sentence_costs(
    synth: Synthesizer, context_synth: Synthesizer
) -> None:
    """A stateful version's plain graphs and a context version's own engines are priced per
    frame and per call by stage: what the scheduler compares a whole sentence's cost with."""
    for engines in (synth.engines, context_synth.engines):
        fresh = Synthesizer(engines)
        assert fresh.whole_costs == {} and fresh.whole_cost(200) == 0.0
        fresh.calibrate()
        assert set(fresh.whole_costs) == {"flow", "vocoder"}
        assert all(per_frame > 0 and call >= 0 for per_frame, call in fresh.whole_costs.values())
        assert fresh.whole_cost(400) > fresh.whole_cost(200) > 0
    old = Synthesizer(dataclasses.replace(synth.engines, plain=None))
    old.calibrate()
    assert old.whole_costs == {}  # no plain graphs: no whole sentences to price


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
