"""The streaming synthesizer: text to PCM chunks, one sentence engine run, then frame windows.

A stream is a generator of steps (``stream_steps``): it yields each engine run it needs as a
``FrameCall`` for the worker's scheduler to answer (alone, or batched with other streams') and
each window's audio as an ``AudioChunk``. The parts it rests on are modules of their own: what
to say in which order (``units``), how a sentence's frames are cut into engine calls
(``frame_steps``), what the engines cost here (``calibration``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import TypeVar

import numpy as np

from ttsvc.audio.resample import StreamResampler
from ttsvc.backends.base import EngineSet, FloatArray, SentenceRun, StreamingEngine
from ttsvc.errors import AudioTooLong, InvalidParameter, TimestampsUnavailable
from ttsvc.protocol import Script, WordTime
from ttsvc.synthesis.calibration import calibrate, measure_seconds_per_id
from ttsvc.synthesis.frame_steps import FLOW_CHUNK, lag_context, whole_steps, window_steps
from ttsvc.synthesis.params import SynthesisParams
from ttsvc.synthesis.steps import Answer, AudioChunk, FrameCall, Pcm16, Steps, drive, to_pcm16
from ttsvc.synthesis.units import Unit, later, unit_marks, units, word_times
from ttsvc.text.frontend import Sentence, TextFrontEnd
from ttsvc.windows import Budget, WindowSchedule

__all__ = ["ESTIMATE_MARGIN", "FLOW_CHUNK", "Synthesizer"]

ESTIMATE_MARGIN = 1.5
"""Audio estimated per phoneme id, as a multiple of the canary's rate: above every kind of text
measured, so the audio cap refuses up front (a clean 422) rather than cutting a stream later."""


T = TypeVar("T")


def _window(start: int, end: int, audio: FloatArray) -> tuple[int, int, FloatArray]:
    return start, end, audio



def _on(steps: Steps[T], engines: EngineSet) -> Steps[T]:
    """``steps`` with every engine call sent to ``engines`` (another voice's)."""
    answer: Answer | None = None
    while True:
        try:
            item = steps.send(answer)
        except StopIteration:
            return
        answer = yield (replace(item, engines=engines) if isinstance(item, FrameCall) else item)



class Synthesizer:
    """Text to streamed PCM for one engine set; used from one compute thread."""

    def __init__(
        self,
        engines: EngineSet,
        schedule: WindowSchedule | None = None,
        max_sentence_chars: int = 200,
    ) -> None:
        self.engines = engines
        self.schedule = schedule or WindowSchedule()
        self.frontend = TextFrontEnd(engines.voice, max_sentence_chars)
        self.hop = engines.manifest.hop_length
        self.stateful = isinstance(engines.vocoder, StreamingEngine)
        """Stateful engines: no context recomputed per window (``_stateful_steps``)."""
        self.vocoder_context = engines.manifest.contexts["vocoder"]
        self.flow_context = engines.manifest.contexts.get("flow")
        if self.stateful:  # what a first window reads past its end: the engines' lag
            self.vocoder_context = lag_context(engines.vocoder)
            self.flow_context = None if engines.flow is None else lag_context(engines.flow)
        self.frame_cost_s = 0.0
        """Flow + vocoder seconds per frame here; 0 until ``calibrate`` ran (no playback cap)."""
        self.flow_cost_s = 0.0
        """Flow seconds per frame (context included); 0 until ``calibrate`` ran."""
        self.vocoder_cost_s = 0.0
        """Vocoder seconds per frame (context included); 0 until ``calibrate`` ran."""
        self.acoustic_cost_s = 0.0
        """Acoustic engine seconds per phoneme id; 0 until ``calibrate`` ran."""
        self.flow_call_s = 0.0
        """Seconds a stateful flow call costs beyond its frames (0 for context engines, whose
        per-frame cost is measured on a full window): 3.5 ms on this project's 2-core AMD EPYC,
        the cost of a 45-frame flow window, so a step estimate ignoring it was far off."""
        self.vocoder_call_s = 0.0
        """The same for the vocoder (0.5 ms there)."""
        self.whole_costs: dict[str, tuple[float, float]] = {}
        """By stage (``flow``, ``vocoder``), the plain graphs' seconds per frame and per call
        beside (``EngineSet.one_shot``): what a whole sentence costs; empty until
        ``calibrate`` ran, or with no plain graphs."""
        self._seconds_per_id: float | None = None

    @property
    def sample_rate(self) -> int:
        """Output rate of the engines."""
        return self.engines.manifest.sample_rate

    def sentences(self, text: str) -> list[Sentence]:
        """Front end only; raises ``NothingToSay`` for text with nothing to speak."""
        return self.frontend.sentences(text)

    def speaker(self, params: SynthesisParams) -> int:
        """The speaker id ``params`` asks for, checked against the voice: an id the voice does
        not have is a 422 on ``speaker`` before any engine runs (an engine would fail on it
        mid-stream, or, single-speaker, ignore it)."""
        speaker = params.speaker or 0
        count = self.engines.voice.num_speakers
        if speaker >= count:
            raise InvalidParameter(
                f"speaker {speaker} is out of range: the voice has "
                + ("a single speaker (id 0)" if count == 1 else f"speakers 0 to {count - 1}"),
                field="speaker",
            )
        return speaker

    def latents(self, ids: tuple[int, ...] | list[int], params: SynthesisParams) -> FloatArray:
        """Run the sentence engine once."""
        arr = np.asarray([ids], dtype=np.int64)
        return self.engines.acoustic.latents(arr, params.scales(self.engines),
                                             self.speaker(params))  # fmt: skip

    def frames(self, latents: FloatArray, speaker: int = 0) -> FloatArray:
        """The whole sentence's decoder frames (the flow in one call, if there is a flow)."""
        flow = self.engines.flow
        return latents if flow is None else flow.frames(latents, speaker)

    def one_shot(self, ids: tuple[int, ...] | list[int], params: SynthesisParams) -> FloatArray:
        """The whole sentence through every engine in one call each: the streaming reference."""
        speaker = self.speaker(params)
        frames = self.frames(self.latents(ids, params), speaker)
        return self.engines.vocoder.waveform(frames, speaker)


    def calibrate(self, frames: int = 64) -> float:
        """Measure flow + vocoder cost per frame (after a warm-up run) for the playback cap,
        and each engine's own cost (per frame, per phoneme id) for a worker's step estimates
        (``synthesis.calibration``)."""
        return calibrate(self, frames)

    def seconds_per_id(self) -> float:
        """Audio seconds per phoneme id at speed 1, measured once on the canary sentence.

        Texts differ around it: prose makes about 1.2 times this, one-word sentences about 1.3,
        spelled-out letters about 1.5, numbers read out about 0.95. The estimate before any
        audio therefore uses ``ESTIMATE_MARGIN`` times it, so a text the cap lets through is
        rarely cut later.
        """
        if self._seconds_per_id is None:
            self._seconds_per_id = measure_seconds_per_id(self)
        return self._seconds_per_id

    def whole_cost(self, frames: int) -> float:
        """Seconds a sentence of ``frames`` frames costs whole on the plain graphs, alone on a
        core (0 until ``calibrate`` ran, or with no plain graphs)."""
        return sum(call + frames * per_frame for per_frame, call in self.whole_costs.values())

    def plan(
        self,
        frames: int,
        schedule: WindowSchedule | None = None,
        budget: Budget | None = None,
    ) -> Iterator[tuple[int, int]]:
        """The vocoder windows a sentence of ``frames`` frames is synthesized in."""
        return (schedule or self.schedule).windows(
            frames,
            frame_cost_s=self.frame_cost_s,
            frame_s=self.hop / self.sample_rate,
            context=0 if self.stateful else self.vocoder_context.left + self.vocoder_context.right,
            budget=budget,
            window_cost_s=self.vocoder_cost_s,
        )

    def windows(
        self,
        latents: FloatArray,
        schedule: WindowSchedule | None = None,
        speaker: int = 0,
    ) -> Iterator[FloatArray]:
        """Float audio of ``latents`` window by window; concatenated, it equals one-shot audio
        (``speaker``: the one the latents were computed for)."""
        steps = window_steps(self, latents, schedule, _window, speaker=speaker)
        for _, _, audio in drive(steps, self.run_call):
            yield audio

    def run_call(self, call: FrameCall) -> Answer:
        """Run one engine call at once, batch of one (the CPU path), on the call's engines
        (another voice's, for a script's run in it) or these."""
        engines = call.engines or self.engines
        if call.stage == "acoustic":
            assert call.scales is not None
            return engines.acoustic.run(call.inputs, call.scales, call.speaker)
        if call.plain:
            plain = engines.one_shot
            assert plain is not None
            if call.stage == "flow":
                assert plain.flow is not None
                return plain.flow.frames(call.inputs, call.speaker)
            return plain.vocoder.waveform(call.inputs, call.speaker)
        engine = engines.flow if call.stage == "flow" else engines.vocoder
        assert engine is not None
        if call.carry is not None:
            assert isinstance(engine, StreamingEngine)
            return engine.step(call.inputs, call.carry, call.speaker)
        if call.stage == "flow":
            assert engines.flow is not None
            return engines.flow.frames(call.inputs, call.speaker)
        return engines.vocoder.waveform(call.inputs, call.speaker)


    def stream_steps(
        self,
        text: str,
        params: SynthesisParams | None = None,
        schedule: WindowSchedule | None = None,
        budget: Budget | None = None,
        max_audio_s: float | None = None,
        script: Script | None = None,
        voices: Mapping[str, Synthesizer] | None = None,
        whole: Callable[[float], bool] | None = None,
    ) -> Steps[AudioChunk]:
        """``stream`` as steps: PCM16 chunks, with the frame-engine runs they need yielded as
        ``FrameCall``s for the caller to answer (one by one, or batched across streams).

        ``max_audio_s`` caps the audio: a text whose estimate (``seconds_per_id``, on the high
        side) exceeds it raises ``AudioTooLong`` before any audio, a clean 422; a sentence that
        would still take the real audio past it raises it before that sentence's first chunk
        (the backstop for texts the estimate misjudges: their stream is cut). ``script``: say
        it instead of ``text`` (SSML: each run at its own rate and volume, breaks as silence,
        marks timed among the words; a run in another voice on that voice's synthesizer, from
        ``voices``, its audio resampled to this one's rate). ``whole``: asked, after each
        sentence's acoustic run, with what the sentence costs whole (``whole_cost``); True runs
        it as one chunk on the plain graphs (``whole_steps``) instead of windows."""
        params = params or SynthesisParams()
        speaker = self.speaker(params)
        held = voices or {}
        said = units(self.frontend, self.sample_rate, text, script, params,
                     {name: v.frontend for name, v in held.items()})  # fmt: skip

        def voice_of(unit: Unit) -> Synthesizer:
            """The synthesizer that says ``unit``: this one, or the voice its run names."""
            return self if unit.voice is None else held[unit.voice]

        if max_audio_s is not None:
            estimate = sum(len(u.sentence.ids) * voice_of(u).seconds_per_id()
                           * ESTIMATE_MARGIN / u.params.speed + u.pause / self.sample_rate
                           for u in said)  # fmt: skip
            if estimate > max_audio_s:
                raise AudioTooLong(f"the text would make about {estimate:.0f} s of audio, over "
                                   f"the {max_audio_s:g} s a request may produce",
                                   field="text")  # fmt: skip
        offset = 0
        schedule = schedule or self.schedule
        for index, unit in enumerate(said):
            sentence, last_sentence = unit.sentence, index == len(said) - 1
            voice = voice_of(unit)
            said_by = speaker if voice is self else 0
            phonemes = np.asarray([sentence.ids], dtype=np.int64)
            run = yield FrameCall("acoustic", phonemes, unit.params.scales(voice.engines),
                                  said_by, engines=None if voice is self else voice.engines)
            assert isinstance(run, SentenceRun)
            latents = run.latents
            total = latents.shape[2]
            timed: list[tuple[int, WordTime]] = []
            lead = len(unit.lead)
            # its samples at this stream's rate (another voice's are resampled to it)
            samples = round(total * voice.hop * self.sample_rate / voice.sample_rate)
            if params.timestamps:
                if run.durations is None:
                    raise TimestampsUnavailable(
                        f"voice {voice.engines.manifest.voice!r} engine version "
                        f"{voice.engines.label} was compiled without phoneme durations: "
                        "recompile it (`ttsvc compile`) for word timestamps",
                        field="voice")  # fmt: skip
                start_s = (offset + lead) / self.sample_rate
                frame_s = voice.hop / voice.sample_rate
                timed = [(first, later(w, start_s)) for first, w in
                         word_times(sentence, run.durations, 0, frame_s, voice.sample_rate)]
                timed += unit_marks(unit, timed, total, start_s + samples / self.sample_rate)
            length = lead + samples + unit.pause
            if max_audio_s is not None and offset + length > max_audio_s * self.sample_rate:
                raise AudioTooLong(f"the audio would pass the {max_audio_s:g} s a request may "
                                   "produce", field="text")  # fmt: skip
            resampler = (None if voice.sample_rate == self.sample_rate
                         else StreamResampler(voice.sample_rate, self.sample_rate))

            def chunk(
                _start: int, end: int, audio: FloatArray,
                index: int = index, last: bool = last_sentence, total: int = total,
                timed: list[tuple[int, WordTime]] = timed, unit: Unit = unit,
                resampler: StreamResampler | None = resampler,
            ) -> AudioChunk:  # fmt: skip
                nonlocal offset
                pcm = to_pcm16(audio if unit.gain == 1.0 else audio * unit.gain)
                sentence_end = end == total
                if resampler is not None:
                    pcm = resampler.process(pcm, last=sentence_end)
                if _start == 0 and len(unit.lead):
                    pcm = np.concatenate([unit.lead, pcm])
                if sentence_end and unit.pause:
                    pcm = np.concatenate([pcm, np.zeros(unit.pause, np.int16)])
                words = tuple(w for first, w in timed if _start <= min(first, total - 1) < end)
                out = AudioChunk(pcm, offset, index, last=last and sentence_end,
                                 offset_s=offset / self.sample_rate, words=words)  # fmt: skip
                offset += len(pcm)
                return out

            if (whole is not None and voice.engines.one_shot is not None
                    and whole(voice.whole_cost(total))):  # fmt: skip
                steps = whole_steps(voice, latents, chunk, said_by)
            else:  # no look-ahead: each window is sent as soon as it is computed
                steps = window_steps(voice, latents, schedule, chunk, budget, said_by)
            yield from (steps if voice is self else _on(steps, voice.engines))


    def stream(
        self,
        text: str,
        params: SynthesisParams | None = None,
        schedule: WindowSchedule | None = None,
        budget: Budget | None = None,
        max_audio_s: float | None = None,
        script: Script | None = None,
        voices: Mapping[str, Synthesizer] | None = None,
    ) -> Iterator[AudioChunk]:
        """PCM16 chunks of ``text`` as soon as each window is computed (``budget``: see
        ``WindowSchedule.windows``; ``max_audio_s``, ``script``, ``voices``: see
        ``stream_steps``)."""
        return drive(self.stream_steps(text, params, schedule, budget, max_audio_s, script,
                                       voices), self.run_call)  # fmt: skip

    def synthesize(self, text: str, params: SynthesisParams | None = None) -> Pcm16:
        """The whole utterance at once (one-shot per sentence), with the same silences."""
        params = params or SynthesisParams()
        silence = np.zeros(round(params.sentence_silence * self.sample_rate), np.int16)
        pieces: list[Pcm16] = []
        sentences = self.sentences(text)
        for index, sentence in enumerate(sentences):
            pieces.append(to_pcm16(self.one_shot(sentence.ids, params)))
            if index < len(sentences) - 1:
                pieces.append(silence)
        return np.concatenate(pieces)
