"""The streaming synthesizer: one sentence engine run, then frame windows through flow and vocoder.

Two kinds of frame engines: stateful ones (``compile/stateful.py``, the default) carry each
layer's state from one call to the next, so a window computes only its own frames; windowed
(context) ones recompute a context on each side, as described next.

Why windows reproduce the one-shot audio exactly: flow and HiFi-GAN are pure convolution, so a
window's output depends only on a bounded neighbourhood of frames. Each engine runs with its own
context of real frames on each side (measured at compile time and recorded in the manifest) and
its output is cropped to the window. The first window is small so audio
starts early; later windows grow so the overlap's cost stays small against throughput.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TypeVar

import numpy as np

from ttsvc.audio.resample import StreamResampler
from ttsvc.backends.base import (
    EngineSet,
    FloatArray,
    IntArray,
    SentenceRun,
    StreamCarry,
    StreamingEngine,
)
from ttsvc.errors import (
    AudioTooLong,
    InvalidParameter,
    NothingToSay,
    TimestampsUnavailable,
    VoiceUnavailable,
)
from ttsvc.protocol import Script, ScriptBreak, ScriptMark, WordTime
from ttsvc.ranges import SPEED_MAX, SPEED_MIN
from ttsvc.repository.manifest import FrameContext
from ttsvc.synthesis.canary import CANARY_TEXT
from ttsvc.synthesis.params import SynthesisParams
from ttsvc.synthesis.steps import Answer, AudioChunk, FrameCall, Pcm16, Steps, drive, to_pcm16
from ttsvc.text.frontend import Sentence, TextFrontEnd, ends_sentence
from ttsvc.windows import Budget, WindowSchedule

ESTIMATE_MARGIN = 1.5
"""Audio estimated per phoneme id, as a multiple of the canary's rate: above every kind of text
measured, so the audio cap refuses up front (a clean 422) rather than cutting a stream later."""

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

T = TypeVar("T")


def _window(start: int, end: int, audio: FloatArray) -> tuple[int, int, FloatArray]:
    return start, end, audio


def _lag_context(engine: object) -> FrameContext:
    """A stateful engine's lag as the frames a first window reads past its end."""
    assert isinstance(engine, StreamingEngine)
    return FrameContext(left=0, right=engine.flush_frames, max_abs_error=0.0)


def _padded(x: FloatArray, start: int, end: int) -> FloatArray:
    """Frames ``[start, end)`` of ``x``, zeros past its end (a stateful engine's flush)."""
    piece = x[:, :, start : min(end, x.shape[2])]
    if piece.shape[2] == end - start:
        return np.ascontiguousarray(piece)
    out = np.zeros((*x.shape[:2], end - start), dtype=np.float32)
    out[:, :, : piece.shape[2]] = piece
    return out


@dataclass(frozen=True)
class _Unit:
    """One sentence to say, with how (its parameters and gain) and the silence around it."""

    sentence: Sentence
    params: SynthesisParams
    gain: float = 1.0
    pause: int = 0
    """Samples of silence after it."""
    lead: Pcm16 = field(default_factory=lambda: np.zeros(0, np.int16))
    """Samples of silence before it (a script's leading break)."""
    marks: tuple[tuple[str, int, bool], ...] = ()
    """Marks timed in it: name, offset in the document, and whether it is timed at the end of
    the sentence's audio (after the last run) rather than at a word."""
    synth: Synthesizer | None = None
    """The voice that says it when not the stream's own (SSML's ``voice``)."""


def _owned(
    marks: tuple[tuple[str, int], ...], sentences: list[Sentence], k: int
) -> tuple[tuple[str, int, bool], ...]:
    """The marks of a run that sentence ``k`` of its ``sentences`` times: those before a word
    it says and after every word of the sentences before it; the last sentence also takes those
    after all words."""
    def first_start(index: int) -> int | None:
        starts = [w.span[0] for w in sentences[index].words]
        return min(starts) if starts else None

    out = []
    for name, at in marks:
        owner = len(sentences) - 1
        for index in range(len(sentences)):
            if any(w.span[0] >= at for w in sentences[index].words):
                owner = index
                break
        if owner == k:
            out.append((name, at, first_start(k) is None))
    return tuple(out)


def _marks(
    unit: _Unit, timed: list[tuple[int, WordTime]], total: int, end_s: float
) -> list[tuple[int, WordTime]]:
    """The unit's marks as ``WordTime``s: at the start of the first word at or after each (in
    the document), else at the end of the sentence's audio."""
    out = []
    for name, at, at_end in unit.marks:
        word = None if at_end else next(
            ((first, w) for first, w in timed if w.text_span[0] >= at), None)  # fmt: skip
        if word is None:
            out.append((total - 1, WordTime(name, end_s, end_s, (at, at), mark=True)))
        else:
            first, w = word
            out.append((first, WordTime(name, w.start, w.start, (at, at), mark=True)))
    return out


def _later(word: WordTime, seconds: float) -> WordTime:
    """``word`` timed ``seconds`` later (a sentence's times from its start to the stream's)."""
    return replace(word, start=word.start + seconds, end=word.end + seconds)


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
            self.vocoder_context = _lag_context(engines.vocoder)
            self.flow_context = None if engines.flow is None else _lag_context(engines.flow)
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
        and each engine's own cost (per frame, per phoneme id) for a worker's step estimates."""
        channels = self.engines.manifest.latent_channels
        if self.stateful:
            costs = self._calibrate_calls(channels, frames)
        else:
            costs = self._calibrate_windows(channels, frames)
        ids = [i for sentence in self.sentences(CANARY_TEXT) for i in sentence.ids]
        params = SynthesisParams(noise_scale=0.0, noise_w=0.0)
        started = time.perf_counter()
        self.latents(ids, params)
        self.acoustic_cost_s = (time.perf_counter() - started) / len(ids)
        self.flow_cost_s = costs[0] if self.engines.flow is not None else 0.0
        self.vocoder_cost_s = costs[1]
        self.frame_cost_s = sum(costs)
        return self.frame_cost_s

    def _calibrate_windows(self, channels: int, frames: int) -> list[float]:
        """Context engines: seconds per frame of a window of ``frames`` and its context."""
        width = frames + self.vocoder_context.left + self.vocoder_context.right
        window = np.zeros((1, channels, width), dtype=np.float32)
        costs = []
        for stage in (self.frames, self.engines.vocoder.waveform):
            stage(window)
            started = time.perf_counter()
            stage(window)
            costs.append((time.perf_counter() - started) / width)
        return costs

    def _calibrate_calls(self, channels: int, frames: int, small: int = 4) -> list[float]:
        """Stateful engines: seconds per frame, and per call beside (``flow_call_s``,
        ``vocoder_call_s``), from calls of ``small`` and ``frames`` frames mid-sentence (the
        best of three each: a neighbour's load only ever adds)."""
        costs = []
        for stage in (self.engines.flow, self.engines.vocoder):
            if stage is None:
                costs.append(0.0)
                continue
            assert isinstance(stage, StreamingEngine)
            timings = []
            for width in (small, frames):
                window = np.zeros((1, channels, width), dtype=np.float32)
                best = float("inf")
                for _ in range(4):  # the first warms the engine up
                    carry = StreamCarry(total=1 << 30, position=1 << 20)
                    started = time.perf_counter()
                    stage.step(window, carry)
                    best = min(best, time.perf_counter() - started)
                timings.append(best)
            per_frame = max(timings[1] - timings[0], 1e-9) / (frames - small)
            call = max(0.0, timings[0] - small * per_frame)
            if stage is self.engines.flow:
                self.flow_call_s = call
            else:
                self.vocoder_call_s = call
            costs.append(per_frame)
        return costs

    def seconds_per_id(self) -> float:
        """Audio seconds per phoneme id at speed 1, measured once on the canary sentence.

        Texts differ around it: prose makes about 1.2 times this, one-word sentences about 1.3,
        spelled-out letters about 1.5, numbers read out about 0.95. The estimate before any
        audio therefore uses ``ESTIMATE_MARGIN`` times it, so a text the cap lets through is
        rarely cut later.
        """
        if self._seconds_per_id is None:
            params = SynthesisParams(noise_scale=0.0, noise_w=0.0)
            ids = frames = 0
            for sentence in self.sentences(CANARY_TEXT):
                ids += len(sentence.ids)
                frames += self.latents(sentence.ids, params).shape[2]
            self._seconds_per_id = frames * self.hop / self.sample_rate / max(1, ids)
        return self._seconds_per_id

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
        steps = self._window_steps(latents, schedule, _window, speaker=speaker)
        for _, _, audio in drive(steps, self.run_call):
            yield audio

    def run_call(self, call: FrameCall) -> Answer:
        """Run one engine call at once, batch of one (the CPU path), on the call's engines
        (another voice's, for a script's run in it) or these."""
        engines = call.engines or self.engines
        if call.stage == "acoustic":
            assert call.scales is not None
            return engines.acoustic.run(call.inputs, call.scales, call.speaker)
        engine = engines.flow if call.stage == "flow" else engines.vocoder
        assert engine is not None
        if call.carry is not None:
            assert isinstance(engine, StreamingEngine)
            return engine.step(call.inputs, call.carry, call.speaker)
        if call.stage == "flow":
            assert engines.flow is not None
            return engines.flow.frames(call.inputs, call.speaker)
        return engines.vocoder.waveform(call.inputs, call.speaker)

    def _window_steps(
        self,
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
        if self.stateful:
            yield from self._stateful_steps(latents, schedule, finish, budget, speaker)
            return
        total = latents.shape[2]
        vctx, hop = self.vocoder_context, self.hop
        flow, fctx = self.engines.flow, self.flow_context
        frames: FloatArray | None = latents if flow is None else None
        done = total if flow is None else 0
        for start, end in self.plan(total, schedule, budget):
            need = min(total, end + vctx.right)
            if flow is not None and fctx is not None and done < need:
                chunk = flow_ahead(end)
                allowed = budget() if budget is not None and self.flow_cost_s > 0 else None
                if allowed is not None:
                    chunk = min(chunk, int(allowed / self.flow_cost_s) - fctx.left - fctx.right)
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

    def _stateful_steps(
        self,
        latents: FloatArray,
        schedule: WindowSchedule | None,
        finish: Callable[[int, int, FloatArray], T],
        budget: Budget | None = None,
        speaker: int = 0,
    ) -> Steps[T]:
        """``_window_steps`` on stateful engines: each frame goes through each engine once.

        The vocoder's output lags its input by ``lag`` samples, so a window ``[start, end)``
        feeds the vocoder up to ``end + flush`` frames (zeros past the sentence: the engine
        masks them), and those frames come from the flow, fed ``lag`` frames further still.
        Each engine's state for this sentence lives in its ``StreamCarry`` here, in the
        stream's own steps, and is dropped with them.
        """
        total = latents.shape[2]
        flow, vocoder = self.engines.flow, self.engines.vocoder
        assert isinstance(vocoder, StreamingEngine)
        hop, vflush = self.hop, vocoder.flush_frames
        channels = latents.shape[1]
        vcarry, fcarry = StreamCarry(total), StreamCarry(total)
        frames = latents if flow is None else np.zeros((1, channels, total), np.float32)
        done = total if flow is None else 0  # decoder frames known
        audio = np.zeros(total * hop, np.float32)
        produced = 0  # samples of ``audio`` known
        for start, end in self.plan(total, schedule, budget):
            need = min(total, end + vflush)
            if flow is not None and done < need:
                assert isinstance(flow, StreamingEngine)
                chunk = flow_ahead(end)
                allowed = budget() if budget is not None and self.flow_cost_s > 0 else None
                if allowed is not None:
                    chunk = min(chunk, int(allowed / self.flow_cost_s))
                target = need if done == 0 else min(total, max(need, done + chunk))
                fed = min(total + flow.lag, target + flow.lag)  # flow input frames wanted
                piece = _padded(latents, fcarry.position, fed)
                out = yield FrameCall("flow", piece, speaker=speaker, carry=fcarry,
                                      window=end - start)  # fmt: skip
                assert isinstance(out, np.ndarray)
                first = fcarry.position - piece.shape[-1] - flow.lag  # sentence frame of out[0]
                lo, hi = max(0, first), min(total, first + out.shape[-1])
                frames[:, :, lo:hi] = out[:, :, lo - first : hi - first]
                done = hi
            fed = min(total + vflush, end + vflush)
            if vcarry.position < fed:
                piece = _padded(frames, vcarry.position, fed)
                out = yield FrameCall("vocoder", piece, speaker=speaker, carry=vcarry)
                assert isinstance(out, np.ndarray)
                first = (vcarry.position - piece.shape[-1]) * hop - vocoder.lag
                lo, hi = max(0, first), min(total * hop, first + out.shape[-1])
                audio[lo:hi] = out[lo - first : hi - first]
                produced = hi
            assert produced >= end * hop
            yield finish(start, end, audio[start * hop : end * hop])

    def stream_steps(
        self,
        text: str,
        params: SynthesisParams | None = None,
        schedule: WindowSchedule | None = None,
        budget: Budget | None = None,
        max_audio_s: float | None = None,
        script: Script | None = None,
        voices: Mapping[str, Synthesizer] | None = None,
    ) -> Steps[AudioChunk]:
        """``stream`` as steps: PCM16 chunks, with the frame-engine runs they need yielded as
        ``FrameCall``s for the caller to answer (one by one, or batched across streams).

        ``max_audio_s`` caps the audio: a text whose estimate (``seconds_per_id``, on the high
        side) exceeds it raises ``AudioTooLong`` before any audio, a clean 422; a sentence that
        would still take the real audio past it raises it before that sentence's first chunk
        (the backstop for texts the estimate misjudges: their stream is cut). ``script``: say
        it instead of ``text`` (SSML: each run at its own rate and volume, breaks as silence,
        marks timed among the words; a run in another voice on that voice's synthesizer, from
        ``voices``, its audio resampled to this one's rate)."""
        params = params or SynthesisParams()
        speaker = self.speaker(params)
        units = self._units(text, script, params, voices or {})
        if max_audio_s is not None:
            estimate = sum(len(u.sentence.ids) * (u.synth or self).seconds_per_id()
                           * ESTIMATE_MARGIN / u.params.speed + u.pause / self.sample_rate
                           for u in units)  # fmt: skip
            if estimate > max_audio_s:
                raise AudioTooLong(f"the text would make about {estimate:.0f} s of audio, over "
                                   f"the {max_audio_s:g} s a request may produce",
                                   field="text")  # fmt: skip
        offset = 0
        schedule = schedule or self.schedule
        for index, unit in enumerate(units):
            sentence, last_sentence = unit.sentence, index == len(units) - 1
            voice = unit.synth or self
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
                timed = [(first, _later(w, start_s))
                         for first, w in voice.word_times(sentence, run.durations, 0)]
                timed += _marks(unit, timed, total, start_s + samples / self.sample_rate)
            length = lead + samples + unit.pause
            if max_audio_s is not None and offset + length > max_audio_s * self.sample_rate:
                raise AudioTooLong(f"the audio would pass the {max_audio_s:g} s a request may "
                                   "produce", field="text")  # fmt: skip
            resampler = (None if voice.sample_rate == self.sample_rate
                         else StreamResampler(voice.sample_rate, self.sample_rate))

            def chunk(
                _start: int, end: int, audio: FloatArray,
                index: int = index, last: bool = last_sentence, total: int = total,
                timed: list[tuple[int, WordTime]] = timed, unit: _Unit = unit,
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

            # no look-ahead: each window is sent as soon as it is computed
            steps = voice._window_steps(latents, schedule, chunk, budget, said_by)
            yield from (steps if voice is self else _on(steps, voice.engines))

    def _units(
        self, text: str, script: Script | None, params: SynthesisParams,
        voices: Mapping[str, Synthesizer],
    ) -> list[_Unit]:  # fmt: skip
        """The sentences to say in order, each with its parameters and the silence around it.

        Plain text: its sentences, the request's sentence pause between them. A script: each
        run's sentences at the run's rate and gain, a break's silence after the sentence before
        it (or before the first), marks with the sentence they are timed in; raises
        ``NothingToSay`` when no run has anything to say."""
        pause = round(params.sentence_silence * self.sample_rate)
        if script is None:
            found = self.frontend.sentences(text, words=params.timestamps)
            return [_Unit(s, params, pause=0 if i == len(found) - 1 else pause)
                    for i, s in enumerate(found)]  # fmt: skip
        units: list[_Unit] = []
        lead = 0
        trailing: list[tuple[str, int]] = []
        natural = 0  # the sentence pause a run that ended a sentence leaves before the next
        carried: list[tuple[str, int]] = []  # marks of runs with nothing to say
        for item in script:
            if isinstance(item, ScriptBreak):
                if item.seconds is None:  # an s or p boundary: at least a sentence's pause
                    natural = pause
                elif units:
                    added = round(item.seconds * self.sample_rate)
                    units[-1] = replace(units[-1], pause=units[-1].pause + added)
                else:
                    lead += round(item.seconds * self.sample_rate)
                continue
            if isinstance(item, ScriptMark):
                trailing.append((item.name, item.at))
                continue
            speed = min(SPEED_MAX, max(SPEED_MIN, params.speed * item.rate))
            run_params = params if speed == params.speed else params.model_copy(
                update={"speed": speed})  # fmt: skip
            voice = None if item.voice is None else voices.get(item.voice)
            if item.voice is not None and voice is None:
                raise VoiceUnavailable(f"voice {item.voice!r} is not loaded for this stream",
                                       field="voice")  # fmt: skip
            found = (voice or self).frontend.run_sentences(item, words=params.timestamps)
            if not found:  # nothing to say in it ("." after a mark): its marks go on
                carried.extend(item.marks)
                continue
            if units and natural:
                units[-1] = replace(units[-1], pause=units[-1].pause + natural)
            marks, carried = (*carried, *item.marks), []
            for k, sentence in enumerate(found):
                units.append(_Unit(sentence, run_params, gain=item.gain,
                                   pause=0 if k == len(found) - 1 else pause,
                                   marks=_owned(marks, found, k), synth=voice))  # fmt: skip
            natural = pause if ends_sentence(found[-1].text) else 0
        if not units:
            raise NothingToSay("the SSML has nothing to speak", field="text")
        units[0] = replace(units[0], lead=np.zeros(lead, np.int16))
        trailing = carried + trailing  # after the last word: at the end of the audio
        if trailing:
            units[-1] = replace(units[-1], marks=units[-1].marks + tuple(
                (name, at, True) for name, at in trailing))  # fmt: skip
        return units

    def word_times(
        self, sentence: Sentence, durations: IntArray, offset: int
    ) -> list[tuple[int, WordTime]]:
        """The sentence's words with their first frame, timed from the frames each phoneme id
        lasts (``durations``) in a sentence whose audio starts at sample ``offset``.

        A word starts where its first phoneme's id begins and ends where the pad after its last
        phoneme ends: the frames the audio was made from, so speed is in them already, and
        times are seconds at the voice's rate whatever rate the stream is resampled to.
        """
        bounds = np.concatenate([[0], np.cumsum(durations)])
        frame_s, base = self.hop / self.sample_rate, offset / self.sample_rate
        out = []
        for word in sentence.words:
            first, end = int(bounds[word.ids[0]]), int(bounds[word.ids[1]])
            out.append((first, WordTime(word.text, base + first * frame_s, base + end * frame_s,
                                        word.span)))  # fmt: skip
        return out

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
