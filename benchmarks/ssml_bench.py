"""What SSML and lexicons cost a request, side by side in one run.

Run from the repository root:

    python benchmarks/ssml_bench.py [--engines-dir DIR] [--rounds N]

Three sections, printed as markdown tables and written to ``benchmarks/results/ssml_bench.json``:

* **gateway**: microseconds per request of the gateway's script step (``core/script.py``
  ``compose``) on the same corpus line: plain text with no lexicon loaded (what every plain
  request pays), plain text with a 200-entry lexicon applied that has none of its words (the
  scan), and the line wrapped in ``<speak>`` (the parse);
* **worker**: milliseconds per line of the worker's front end: ``sentences(text)`` (plain) and
  ``run_sentences`` of the same line as a document (what an SSML request costs the worker),
  with the ratio of the two.

* **heard** (``--asr``, needs the ``bench`` extra): each markup case (a ``say-as`` of each kind,
  ``sub``, ``phoneme``, a lexicon's alias and pronunciation) and the same text plain, through the
  real voice and an offline recognizer (PocketSphinx with its bundled en-us model: Whisper's
  weights cannot be fetched here), with whether the transcript has the words the markup asked
  for and differs from the plain one.

Rounds alternate the variants, so a neighbour's load falls on each alike.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_common.context import ROOT, load_corpus, machine_info, utc_timestamp
from bench_common.report import fmt, markdown_table, write_json
from ttsvc.audio.encode import FORMATS
from ttsvc.compile.build import ensure_default_voice
from ttsvc.config import DEFAULT_VOICE, Settings
from ttsvc.gateway.core.order import SpeechOrder
from ttsvc.gateway.core.script import compose
from ttsvc.gateway.core.state import GatewayState
from ttsvc.lifecycle.lexicons import LexiconStore
from ttsvc.protocol import ScriptRun
from ttsvc.synthesis import Synthesizer
from ttsvc.text.ssml import parse_ssml

RESULT = ROOT / "benchmarks" / "results" / "ssml_bench.json"
LEXICON = ('<?xml version="1.0" encoding="UTF-8"?><lexicon version="1.0" '
           'xmlns="http://www.w3.org/2005/01/pronunciation-lexicon" alphabet="ipa" '
           'xml:lang="en-US">{}</lexicon>')


def escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def gateway(lines: list[str], rounds: int, scratch: Path) -> dict[str, float]:
    """Microseconds per ``compose`` call for each variant, the median over rounds."""
    settings = Settings(workers=1, compute_threads=1, max_text_chars=100_000)
    plain = GatewayState(settings, DEFAULT_VOICE)
    loaded = GatewayState(settings, DEFAULT_VOICE)
    (scratch / "lexicons").mkdir()
    entries = "".join(f"<lexeme><grapheme>Zq{i}x</grapheme><alias>word {i}</alias></lexeme>"
                      for i in range(200))  # fmt: skip
    (scratch / "lexicons" / "names.pls").write_text(LEXICON.format(entries), encoding="utf-8")
    loaded.lexicons = LexiconStore(scratch)
    loaded.lexicons.reload()
    orders = {
        "plain": (plain, [order(line, False) for line in lines]),
        "plain, a 200-entry lexicon applied": (loaded, [order(line, False, ("names",))
                                                       for line in lines]),
        "ssml": (plain, [order(f"<speak>{escape(line)}</speak>", True) for line in lines]),
    }
    samples: dict[str, list[float]] = {name: [] for name in orders}

    async def once(state: GatewayState, batch: list[SpeechOrder]) -> float:
        started = time.perf_counter()
        for speech in batch:
            await compose(state, speech)
        return (time.perf_counter() - started) / len(batch) * 1e6

    loop = asyncio.new_event_loop()
    try:
        for _ in range(rounds):
            for name, (state, batch) in orders.items():
                samples[name].append(loop.run_until_complete(once(state, batch)))
    finally:
        loop.close()
    return {name: statistics.median(values) for name, values in samples.items()}


def order(text: str, ssml: bool, lexicons: tuple[str, ...] | None = None) -> SpeechOrder:
    return SpeechOrder(text=text, voice=DEFAULT_VOICE, format=FORMATS["pcm"], stream=True,
                       api="synthesize", ssml=ssml, lexicons=lexicons)  # fmt: skip


def worker(synth: Synthesizer, lines: list[str], rounds: int) -> dict[str, float]:
    """Milliseconds per line of the front end, plain and as a document, median over rounds."""
    runs = []
    for line in lines:
        (run,) = [i for i in parse_ssml(f"<speak>{escape(line)}</speak>").script
                  if isinstance(i, ScriptRun)]  # fmt: skip
        runs.append(run)
    samples: dict[str, list[float]] = {"plain": [], "ssml": []}
    for _ in range(rounds):
        started = time.perf_counter()
        for line in lines:
            synth.frontend.sentences(line)
        samples["plain"].append((time.perf_counter() - started) / len(lines) * 1e3)
        started = time.perf_counter()
        for run in runs:
            synth.frontend.run_sentences(run)
        samples["ssml"].append((time.perf_counter() - started) / len(lines) * 1e3)
    return {name: statistics.median(values) for name, values in samples.items()}


ASR_LEXICON = ('<lexeme><grapheme>Zork</grapheme><alias>big red dragon</alias></lexeme>'
               '<lexeme><grapheme>Tomato</grapheme><phoneme>pəˈteɪtoʊ</phoneme></lexeme>')
CASES: tuple[tuple[str, str, str, str], ...] = (
    # (case, plain text, markup, words the markup asks to hear)
    ("say-as characters", "The code is ABC.",
     'The code is <say-as interpret-as="characters">abc</say-as>.', "b c"),
    ("say-as cardinal", "Room 12 please.",
     'Room <say-as interpret-as="cardinal">12</say-as> please.', "twelve"),
    ("say-as ordinal", "She finished 3 in the race.",
     'She finished <say-as interpret-as="ordinal">3</say-as> in the race.', "third"),
    ("say-as digits", "Call 1234 now.",
     'Call <say-as interpret-as="digits">1234</say-as> now.', "one two three four"),
    ("say-as telephone", "Dial 867-5309 now.",
     'Dial <say-as interpret-as="telephone">867-5309</say-as> now.', "five three zero nine"),
    ("say-as date dmy", "It is 03/04/2024.",
     'It is <say-as interpret-as="date" format="dmy">03/04/2024</say-as>.', "april third"),
    ("say-as time", "Meet at 9:30 am.",
     'Meet at <say-as interpret-as="time">9:30 am</say-as>.', "nine thirty"),
    ("say-as currency", "It costs 12.50 today.",
     'It costs <say-as interpret-as="currency">12.50</say-as> today.', "twelve dollars"),
    ("sub", "The WWW is big.", 'The <sub alias="World Wide Web">WWW</sub> is big.',
     "world wide web"),
    ("phoneme", "I like tomato soup.",
     'I like <phoneme alphabet="ipa" ph="pəˈteɪtoʊ">tomato</phoneme> soup.', "potato"),
    ("lexicon alias", "Zork is here.", "Zork is here.", "big red dragon"),
    ("lexicon phoneme", "Tomato soup is hot.", "Tomato soup is hot.", "potato"),
)  # fmt: skip
"""Cases for ``--asr``: the two lexicon cases' markup is the plain text with a lexicon loaded."""


def heard(synth: Synthesizer, scratch: Path) -> list[dict[str, Any]]:
    """Each case spoken plain and with its markup, and what the recognizer heard."""
    import numpy as np  # noqa: PLC0415
    import soxr  # noqa: PLC0415
    from pocketsphinx import Decoder  # noqa: PLC0415

    from ttsvc.gateway.core.script import apply_lexicons  # noqa: PLC0415
    from ttsvc.protocol import ScriptText  # noqa: PLC0415
    from ttsvc.synthesis import SynthesisParams  # noqa: PLC0415

    (scratch / "lexicons").mkdir(exist_ok=True)
    (scratch / "lexicons" / "asr.pls").write_text(LEXICON.format(ASR_LEXICON), encoding="utf-8")
    store = LexiconStore(scratch)
    store.reload()
    decoder = Decoder(samprate=16000)
    params = SynthesisParams(noise_scale=0.0, noise_w=0.0)

    def transcript(script: Any) -> str:
        pcm = np.concatenate([c.samples for c in synth.stream("", params, script=script)])
        audio = soxr.resample(pcm.astype(np.float32) / 32768, synth.sample_rate, 16000)
        decoder.start_utt()
        decoder.process_raw((np.clip(audio, -1, 1) * 32767).astype(np.int16).tobytes(),
                            full_utt=True)  # fmt: skip
        decoder.end_utt()
        hyp = decoder.hyp()
        return hyp.hypstr if hyp is not None else ""

    rows = []
    for case, plain, markup, expected in CASES:
        plain_script = (ScriptRun((ScriptText(plain, (0, len(plain))),)),)
        if case.startswith("lexicon"):
            marked = apply_lexicons(plain_script, store.current, ("asr",))
        else:
            marked = parse_ssml(f"<speak>{markup}</speak>").script
        said_plain, said_marked = transcript(plain_script), transcript(marked)
        rows.append({"case": case, "expected": expected, "plain": said_plain,
                     "markup": said_marked, "has_expected": expected in said_marked,
                     "differs": said_plain != said_marked})  # fmt: skip
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines-dir", type=Path, default=ROOT / "engines")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--lines", type=int, default=40, help="corpus lines per round")
    parser.add_argument("--asr", action="store_true",
                        help="also transcribe the markup cases (needs the bench extra)")
    args = parser.parse_args()
    lines = load_corpus(ROOT / "benchmarks" / "corpus.txt")[: args.lines]
    version = ensure_default_voice(args.engines_dir, print)
    from ttsvc.backends.loader import load_engine_set  # noqa: PLC0415

    synth = Synthesizer(load_engine_set(version.path))
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch:
        costs = gateway(lines, args.rounds, Path(scratch))
        if args.asr:
            rows = heard(synth, Path(scratch))
    front = worker(synth, lines, args.rounds)
    print(f"{len(lines)} corpus lines, {args.rounds} rounds, medians\n")
    print(markdown_table(["gateway script step", "µs per request"], "lr",
                         [[name, fmt(value, 1)] for name, value in costs.items()]))  # fmt: skip
    print()
    print(markdown_table(["worker front end", "ms per line", "ratio to plain"], "lrr",
                         [[name, fmt(value, 2), fmt(value / front["plain"], 2)]
                          for name, value in front.items()]))  # fmt: skip
    if rows:
        print()
        print(markdown_table(["case", "asked for", "heard, plain", "heard, markup", "has it",
                              "differs"], "llllll",
                             [[r["case"], r["expected"], r["plain"], r["markup"],
                               "yes" if r["has_expected"] else "no",
                               "yes" if r["differs"] else "no"] for r in rows]))  # fmt: skip
    result: dict[str, Any] = {"machine": machine_info({}), "at": utc_timestamp(),
                              "lines": len(lines), "rounds": args.rounds,
                              "gateway_us": costs, "worker_ms": front, "heard": rows}  # fmt: skip
    write_json(RESULT, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
