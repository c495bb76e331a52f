"""What a stream says, in order: sentences, each with its parameters, gain, voice and the
silence and marks around it, and the times of its words.

Why a module of its own: plain text and SSML scripts (rates, volumes, breaks, marks, runs in
other voices) both come down to one list of ``Unit``s, which the synthesizer then speaks one
after another without asking where they came from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from ttsvc.backends.base import IntArray
from ttsvc.errors import NothingToSay, VoiceUnavailable
from ttsvc.protocol import Script, ScriptBreak, ScriptMark, WordTime
from ttsvc.ranges import SPEED_MAX, SPEED_MIN
from ttsvc.synthesis.params import SynthesisParams
from ttsvc.synthesis.steps import Pcm16
from ttsvc.text.frontend import Sentence, TextFrontEnd, ends_sentence


@dataclass(frozen=True)
class Unit:
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
    voice: str | None = None
    """The voice that says it when not the stream's own (SSML's ``voice``), by name."""



def owned_marks(
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



def unit_marks(
    unit: Unit, timed: list[tuple[int, WordTime]], total: int, end_s: float
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



def later(word: WordTime, seconds: float) -> WordTime:
    """``word`` timed ``seconds`` later (a sentence's times from its start to the stream's)."""
    return replace(word, start=word.start + seconds, end=word.end + seconds)



def units(
    frontend: TextFrontEnd, sample_rate: int, text: str, script: Script | None,
    params: SynthesisParams, frontends: Mapping[str, TextFrontEnd],
) -> list[Unit]:  # fmt: skip
    """The sentences to say in order, each with its parameters and the silence around it:
    ``frontend`` splits the stream's own voice's text, ``frontends`` those of the other voices
    it holds for a script's runs, by name; silences are samples at ``sample_rate``.

    Plain text: its sentences, the request's sentence pause between them. A script: each
    run's sentences at the run's rate and gain, a break's silence after the sentence before
    it (or before the first), marks with the sentence they are timed in; raises
    ``NothingToSay`` when no run has anything to say."""
    pause = round(params.sentence_silence * sample_rate)
    if script is None:
        found = frontend.sentences(text, words=params.timestamps)
        return [Unit(s, params, pause=0 if i == len(found) - 1 else pause)
                for i, s in enumerate(found)]  # fmt: skip
    said: list[Unit] = []
    lead = 0
    trailing: list[tuple[str, int]] = []
    natural = 0  # the sentence pause a run that ended a sentence leaves before the next
    carried: list[tuple[str, int]] = []  # marks of runs with nothing to say
    for item in script:
        if isinstance(item, ScriptBreak):
            if item.seconds is None:  # an s or p boundary: at least a sentence's pause
                natural = pause
            elif said:
                added = round(item.seconds * sample_rate)
                said[-1] = replace(said[-1], pause=said[-1].pause + added)
            else:
                lead += round(item.seconds * sample_rate)
            continue
        if isinstance(item, ScriptMark):
            trailing.append((item.name, item.at))
            continue
        speed = min(SPEED_MAX, max(SPEED_MIN, params.speed * item.rate))
        run_params = params if speed == params.speed else params.model_copy(
            update={"speed": speed})  # fmt: skip
        splitter = frontend if item.voice is None else frontends.get(item.voice)
        if splitter is None:
            raise VoiceUnavailable(f"voice {item.voice!r} is not loaded for this stream",
                                   field="voice")  # fmt: skip
        found = splitter.run_sentences(item, words=params.timestamps)
        if not found:  # nothing to say in it ("." after a mark): its marks go on
            carried.extend(item.marks)
            continue
        if said and natural:
            said[-1] = replace(said[-1], pause=said[-1].pause + natural)
        marks, carried = (*carried, *item.marks), []
        for k, sentence in enumerate(found):
            said.append(Unit(sentence, run_params, gain=item.gain,
                               pause=0 if k == len(found) - 1 else pause,
                               marks=owned_marks(marks, found, k), voice=item.voice))  # fmt: skip
        natural = pause if ends_sentence(found[-1].text) else 0
    if not said:
        raise NothingToSay("the SSML has nothing to speak", field="text")
    said[0] = replace(said[0], lead=np.zeros(lead, np.int16))
    trailing = carried + trailing  # after the last word: at the end of the audio
    if trailing:
        said[-1] = replace(said[-1], marks=said[-1].marks + tuple(
            (name, at, True) for name, at in trailing))  # fmt: skip
    return said


def word_times(
    sentence: Sentence, durations: IntArray, offset: int, frame_s: float, sample_rate: int
) -> list[tuple[int, WordTime]]:
    """The sentence's words with their first frame, timed from the frames each phoneme id
    lasts (``durations``) in a sentence whose audio starts at sample ``offset``.

    A word starts where its first phoneme's id begins and ends where the pad after its last
    phoneme ends: the frames the audio was made from, so speed is in them already, and
    times are seconds at the voice's rate whatever rate the stream is resampled to.
    """
    bounds = np.concatenate([[0], np.cumsum(durations)])
    base = offset / sample_rate
    out = []
    for word in sentence.words:
        first, end = int(bounds[word.ids[0]]), int(bounds[word.ids[1]])
        out.append((first, WordTime(word.text, base + first * frame_s, base + end * frame_s,
                                    word.span)))  # fmt: skip
    return out

