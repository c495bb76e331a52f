"""Speech length and intelligibility against the requested speed, for three duration rules.

Why this exists: VITS rounds every phoneme id's frames up, so each id (Piper's pads between
phonemes included) keeps at least one frame, and above speed ~2 speech stopped shortening
(issue 28). The first fix divided every id's speed-1 frames by the speed and rounded their
running sum: the length followed 1/speed, but whole phonemes got no frame and an offline
recognizer understood much less than Piper's own speech of the same length. The sentence engine
now keeps one frame for every phoneme (``ttsvc.compile.speed``). This measures, on the packaged
voice's own graph, at OpenAI's speeds 0.25-4, with noise 0 (every run gives the same audio):

* **ceil**: Piper's graph as it is, ``ceil(w * length_scale)`` (what engines made before);
* **cumulative**: the first fix, ``round(cumsum(D1 / speed))`` differenced, fed to the same graph
  in place of its rounded durations (``D1``: the voice's frames at speed 1);
* **shipped**: the graph with ``follow_speed`` applied, as the compile does.

For each: the length of 8 fixed sentences against speed 1 ("faster"), and PocketSphinx's word
error rate (its bundled en-us model, 16 kHz, whole utterances; edit distance on words over the
words of the 8 sentences). Compare rules at equal length, not at equal speed: Piper's ceil
never gets faster than ~2x. A recognizer is harsher than a listener (it already misses words at
speed 1.5), so the figures rank the rules; they are not a listener's score. At speed 1 and below
the shipped graph must be Piper's to the bit; the table says whether it is. Run from the
repository root (needs the ``bench`` extra, for ``pocketsphinx``)::

    python benchmarks/speed_bench.py
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import soxr

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent / "src"))

from bench_common import (  # noqa: E402
    machine_info,
    markdown_table,
    relative,
    utc_timestamp,
    write_atomic,
    write_json,
)
from ttsvc.compile.build import default_checkpoint  # noqa: E402
from ttsvc.compile.inputs import load_piper_graph, read_voice_config  # noqa: E402
from ttsvc.compile.speed import follow_speed  # noqa: E402
from ttsvc.compile.split import find_split  # noqa: E402
from ttsvc.text.frontend import TextFrontEnd  # noqa: E402
from ttsvc.text.phonemize import PAD  # noqa: E402

SPEEDS = (0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0)
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Please call me back after lunch.",
    "I would like a cup of coffee.",
    "Is this the right way to the station?",
    "The weather will be sunny tomorrow afternoon.",
    "She sold her old car to a neighbor last week.",
    "We need more time to finish the project.",
    "Turn left at the next traffic light.",
)
RULES = ("ceil", "cumulative", "shipped")
_RATE_ASR = 16000
_FED = "speed_bench/durations"
"""The input that replaces the rounded durations in the graph the cumulative rule is fed to."""

Feeds = dict[str, np.ndarray]


def word_errors(reference: str, hypothesis: str) -> int:
    """Word-level edit distance (substitutions, deletions, insertions)."""
    ref, hyp = reference.split(), hypothesis.split()
    row = list(range(len(hyp) + 1))
    for i, word in enumerate(ref, start=1):
        diagonal, row[0] = row[0], i
        for j, heard in enumerate(hyp, start=1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (word != heard))
    return row[len(hyp)]


def _words(text: str) -> str:
    return " ".join(re.sub(r"[^a-z' ]", " ", text.lower()).split())


class _Recognizer:
    """PocketSphinx on one whole utterance at a time. A fresh decoder for each: one decoder
    carries its noise estimate from utterance to utterance, so the same audio was heard
    differently after different audio (0.3 s a decoder)."""

    def __init__(self, rate: int) -> None:
        self._rate = rate

    def __call__(self, audio: np.ndarray) -> str:
        from pocketsphinx import Decoder  # type: ignore[import-untyped]  # noqa: PLC0415  (bench)

        peak = max(float(np.abs(audio).max()), 1e-3)  # Piper's own normalization to full scale
        pcm = soxr.resample((audio / peak).astype(np.float32), self._rate, _RATE_ASR)
        data = (np.clip(pcm, -1.0, 1.0) * 32767).astype(np.int16).tobytes()
        decoder = Decoder(samprate=_RATE_ASR, cmn="batch", loglevel="FATAL")
        decoder.start_utt()
        decoder.process_raw(data, full_utt=True)
        decoder.end_utt()
        hyp = decoder.hyp()
        return _words(hyp.hypstr) if hyp is not None else ""


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _graphs(voice_length_scale: float, pad_ids: list[int]) -> dict[str, ort.InferenceSession]:
    """Piper's graph (also outputting its rounded durations), the same fed durations from
    outside, and the shipped rewrite."""
    piper = load_piper_graph(default_checkpoint()[0])
    rounded = find_split(piper, "flow").durations
    assert rounded is not None
    piper.graph.output.append(onnx.helper.make_tensor_value_info(rounded, onnx.TensorProto.FLOAT,
                                                                 None))  # fmt: skip
    fed = onnx.ModelProto()
    fed.CopyFrom(piper)
    for node in fed.graph.node:
        node.input[:] = [_FED if name == rounded else name for name in node.input]
    fed.graph.input.append(onnx.helper.make_tensor_value_info(_FED, onnx.TensorProto.FLOAT,
                                                              [1, 1, None]))  # fmt: skip
    shipped = onnx.ModelProto()
    shipped.CopyFrom(piper)
    if follow_speed(shipped, rounded, voice_length_scale, pad_ids) is None:
        raise SystemExit("follow_speed did not recognise the packaged voice's graph")
    return {"ceil": _session(piper), "fed": _session(fed), "shipped": _session(shipped)}


def _cumulative(d1: np.ndarray, speed: float) -> np.ndarray:
    ends = np.round(np.cumsum(d1 / speed, axis=-1))
    return np.diff(ends, prepend=0.0, axis=-1).astype(np.float32)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=ROOT / "results" / "speed_bench.json")
    args = parser.parse_args()

    _, voice = read_voice_config(default_checkpoint()[1])
    scale = voice.inference.length_scale
    graphs = _graphs(scale, voice.phoneme_id_map[PAD])
    front = TextFrontEnd(voice)
    ids = [np.asarray([s.ids], dtype=np.int64) for text in SENTENCES for s in front.sentences(text)]
    assert len(ids) == len(SENTENCES)
    recognize = _Recognizer(voice.sample_rate)
    references = [_words(text) for text in SENTENCES]
    total_words = sum(len(r.split()) for r in references)

    def feeds(x: np.ndarray, speed: float) -> Feeds:
        return {"input": x, "input_lengths": np.asarray([x.shape[1]]),
                "scales": np.asarray([0.0, scale / speed, 0.0], dtype=np.float32)}  # fmt: skip

    d1 = [graphs["ceil"].run(None, feeds(x, 1.0))[1] for x in ids]
    run: dict[str, Callable[[int, float], np.ndarray]] = {
        "ceil": lambda k, speed: graphs["ceil"].run(None, feeds(ids[k], speed))[0],
        "cumulative": lambda k, speed: graphs["fed"].run(
            None, feeds(ids[k], 1.0) | {_FED: _cumulative(d1[k], speed)})[0],
        "shipped": lambda k, speed: graphs["shipped"].run(None, feeds(ids[k], speed))[0],
    }  # fmt: skip

    rows: list[dict[str, Any]] = []
    for speed in SPEEDS:
        row: dict[str, Any] = {"speed": speed}
        audio: dict[str, list[np.ndarray]] = {}
        for rule in RULES:
            if speed <= 1.0 and rule == "cumulative":
                audio[rule] = audio["ceil"]  # the rule is Piper's there
                continue
            audio[rule] = [np.asarray(run[rule](k, speed)).reshape(-1) for k in range(len(ids))]
        if speed <= 1.0:
            pairs = zip(audio["shipped"], audio["ceil"], strict=True)
            row["shipped_is_pipers"] = all(np.array_equal(a, b) for a, b in pairs)
        for rule in RULES:
            if rule == "cumulative" and speed <= 1.0:
                row[rule] = row["ceil"]
                continue
            heard = [recognize(a) for a in audio[rule]]
            errors = sum(word_errors(r, h) for r, h in zip(references, heard, strict=True))
            row[rule] = {"samples": sum(len(a) for a in audio[rule]),
                         "wer": errors / total_words, "heard": heard}  # fmt: skip
        rows.append(row)
        print(f"speed {speed:4}: " + ", ".join(
            f"{rule} {row[rule]['samples'] / voice.sample_rate:.2f} s WER "
            f"{row[rule]['wer']:.2f}" for rule in RULES), flush=True)  # fmt: skip
    at_1 = next(r for r in rows if r["speed"] == 1.0)
    for row in rows:
        for rule in RULES:
            row[rule]["faster"] = at_1[rule]["samples"] / row[rule]["samples"]

    # Piper's WER at the shipped rule's length, read off Piper's own curve where it gets there
    ceil_x = [r["ceil"]["faster"] for r in rows]
    ceil_wer = [r["ceil"]["wer"] for r in rows]
    for row in rows:
        x = row["shipped"]["faster"]
        reached = min(ceil_x) <= x <= max(ceil_x)
        row["ceil_wer_at_shipped_length"] = (
            float(np.interp(x, ceil_x, ceil_wer)) if reached else None
        )

    header = ["speed"] + [f"{rule}: {what}" for rule in RULES for what in ("faster", "WER")]
    header += ["ceil WER at shipped's length", "shipped = Piper's"]
    cells = []
    for r in rows:
        line = [f"{r['speed']:g}"]
        for rule in RULES:
            line += [f"{r[rule]['faster']:.2f}x", f"{r[rule]['wer']:.2f}"]
        at = r["ceil_wer_at_shipped_length"]
        line.append("ceil is never this short" if at is None else f"{at:.2f}")
        same = r.get("shipped_is_pipers")
        line.append("" if same is None else "yes" if same else "NO")
        cells.append(line)
    table = markdown_table(header, "r" * len(header), cells)
    print(table)
    sphinx = importlib.metadata.version("pocketsphinx")
    report: dict[str, Any] = {"benchmark": "speed_bench", "when": utc_timestamp(),
              "machine": machine_info({"onnxruntime": ort.__version__, "pocketsphinx": sphinx}),
              "sentences": list(SENTENCES), "words": total_words, "rows": rows}  # fmt: skip
    write_json(args.json, report)
    write_atomic(args.json.with_suffix(".md"), f"# Speech length and intelligibility against "
                 f"speed\n\n`python benchmarks/speed_bench.py` ({report['when']}, "
                 f"{report['machine']['cpu_model']}, {report['machine']['cpu_count']} cores; "
                 f"PocketSphinx {sphinx}, en-us). {len(SENTENCES)} sentences, {total_words} "
                 f"words, noise 0; faster: speech length at speed 1 over length at the speed; "
                 f"WER: the recognizer's word error rate. ceil: Piper's own durations (engines "
                 f"before issue 28); cumulative: every id's speed-1 frames over the speed, "
                 f"running sum rounded (the first fix); shipped: `compile/speed.py` now, one "
                 f"frame kept for every phoneme.\n\n{table}\n")  # fmt: skip
    print(f"wrote {relative(args.json)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
