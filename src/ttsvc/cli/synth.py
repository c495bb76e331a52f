"""``ttsvc synth``: synthesize text to a WAV file through the streaming path.

Its own module so the synthesizer and its engines stay behind the imports inside ``cmd_synth``:
building the parser never loads them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from ttsvc.cli.args import HelpFormatter, document_defaults, invalid
from ttsvc.cli.engines import resolve_engines
from ttsvc.config import Settings


def add_synth(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("synth", help="synthesize text to a WAV file through the streaming path",
                       formatter_class=HelpFormatter)  # fmt: skip
    p.add_argument("text", help="what to say")
    p.add_argument("-o", "--output", type=Path, default=Path("out.wav"), help="WAV file to write")
    p.add_argument("--engines-dir", type=Path, default=None, help="engine repository root")
    p.add_argument("--voice", default=None, help="voice to speak with")
    p.add_argument("--speed", type=float, default=1.0, help="speaking rate (0.25-4)")
    p.add_argument("--noise-scale", type=float, default=None,
                   help="voice variation, 0-2 (default: the voice's config)")
    p.add_argument("--noise-w", type=float, default=None,
                   help="phoneme length variation, 0-2 (default: the voice's config)")
    p.add_argument("--sentence-silence", type=float, default=0.2,
                   help="seconds of silence after each sentence")
    p.add_argument("--speaker", default=None,
                   help="speaker name or id of a multi-speaker voice (default: its first, id 0)")
    p.add_argument("--threads", type=int, default=None, help="ONNX Runtime threads per engine run")
    p.add_argument("--first-window", type=int, default=None, help="frames in the first window")
    document_defaults(p)


def cmd_synth(args: argparse.Namespace, settings: Settings) -> int:
    from ttsvc.audio.wav import write_wav  # noqa: PLC0415
    from ttsvc.backends.loader import load_engine_set  # noqa: PLC0415
    from ttsvc.synthesis import SynthesisParams, Synthesizer  # noqa: PLC0415
    from ttsvc.voice import speaker_id  # noqa: PLC0415

    try:
        params = SynthesisParams(
            speed=args.speed, noise_scale=args.noise_scale, noise_w=args.noise_w,
            sentence_silence=args.sentence_silence,
        )  # fmt: skip
    except ValueError as exc:
        print(f"ttsvc synth: invalid parameter: {invalid(exc)}", file=sys.stderr)
        return 2
    path = resolve_engines(settings, settings.voice)
    started = time.perf_counter()
    engines = load_engine_set(path, settings.threads)
    loaded = time.perf_counter()
    try:  # names live in the voice's config: known only once its engines are loaded
        params = params.model_copy(update={"speaker": speaker_id(engines.voice, args.speaker)})
    except ValueError as exc:
        print(f"ttsvc synth: invalid parameter: speaker: {exc}", file=sys.stderr)
        return 2
    synth = Synthesizer(engines, settings.schedule(), settings.max_sentence_chars)
    synth.calibrate()
    chunks: list[np.ndarray] = []
    first: float | None = None
    t0 = time.perf_counter()
    for chunk in synth.stream(args.text, params):
        if first is None:
            first = time.perf_counter() - t0
        chunks.append(chunk.samples)
    total = time.perf_counter() - t0
    pcm = np.concatenate(chunks)
    write_wav(args.output, pcm, synth.sample_rate)
    audio_s = len(pcm) / synth.sample_rate
    print(
        f"wrote {args.output} ({audio_s:.2f} s of audio, {len(chunks)} chunks, engines "
        f"{engines.manifest.voice} v{engines.version}): load {1000 * (loaded - started):.0f} ms, "
        f"first chunk {1000 * (first or 0):.1f} ms, real-time factor {total / audio_s:.3f}"
    )
    return 0
