"""Time to first audio through the voice-agent frameworks' own TTS classes, side by side.

Why this exists: LiveKit Agents and Pipecat can reach ttsvc through their OpenAI classes (one HTTP
request per sentence: LiveKit's ``openai.TTS`` is not a streaming class, so an agent wraps it in
``tts.StreamAdapter``, which splits sentences) or through their ElevenLabs classes (text streamed
in over ElevenLabs' ``multi-stream-input`` WebSocket). What an agent's user hears is how soon the
first sentence sounds once the LLM has written it, through the framework's own class, its
sentence splitting and buffering included; ``agents_bench.py`` times ttsvc's APIs with plain
clients, this times the six classes, on one server, in one run.

One ``ttsvc serve`` (default workers) on loopback. Each class is held open for the whole run, as
an agent's session holds it: LiveKit's ``elevenlabs.TTS`` and ``openai.TTS`` (behind the
``StreamAdapter`` and blingfire sentence tokenizer ``AgentSession`` puts in front of a
non-streaming TTS), each turn one ``stream()``; Pipecat's ``ElevenLabsTTSService``,
``ElevenLabsHttpTTSService``, ``OpenAITTSService`` and ``PiperHttpTTSService`` (Piper's own
protocol, ``/synthesize``), each in a running pipeline ``[stamp, tts, probe]``, each turn
``LLMFullResponseStartFrame``, the tokens as ``LLMTextFrame``s, ``LLMFullResponseEndFrame``. Each
round runs one turn through every class, in an order that rotates from round to round; a turn
ends when its last audio is out (Pipecat: the ``LLMFullResponseEndFrame``, which the TTS holds
behind the turn's audio), so turns never overlap.

The clock: the reply (several sentences) is pushed token by token (words with their leading
space), a token every ``--token-ms`` (25 ms: an LLM writing 40 tokens a second, faster than
speech). It starts once the token that ends the first sentence (its full stop or question mark)
has been handed to the class (LiveKit: ``push_text`` returned; Pipecat: the frame pushed on to
the TTS processor) and stops at the first audio frame the class gives out (LiveKit: the first
``SynthesizedAudio``; Pipecat: the first ``TTSAudioRawFrame`` after the TTS). The next tokens
follow at the LLM's pace, so a class (or a server) that holds a finished sentence until more
text arrives shows that wait here: Pipecat's ``ElevenLabsTTSService`` sends whole sentences with
``auto_mode=true`` and no flush, and once waited for the second sentence's text (issue 38). The
ElevenLabs and OpenAI classes get PCM at 24 kHz (``pcm_24000``; OpenAI's ``pcm``), so no class
decodes a compressed format; Piper's protocol answers WAV at the voice's rate; the voice is the
served default (OpenAI's ``alloy`` maps to it). "Last audio" is the turn's last audio frame on
the same clock. The clock is this process's: the frameworks' own tasks, queues, sentence
splitters and WebSocket or HTTP clients are in the figures, as an agent would have them.

A benchmark, not a test: it prints a markdown table and never fails on a number. Run from the
repository root (needs the ``clients`` extra: ``pip install -e '.[clients]'``)::

    python benchmarks/agent_plugins_bench.py [--rounds 20] [--engines-dir DIR]

Results go to ``benchmarks/results/agent_plugins_bench.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import sys
import time
import warnings
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httpx

from bench_common import (
    DEFAULT_CORPUS,
    DEFAULT_ENGINES,
    RESULTS,
    SERVER_LOG_DIR,
    Server,
    fmt,
    load_corpus,
    machine_info,
    pct,
    relative,
    utc_timestamp,
    write_atomic,
    write_json,
)
from ttsvc.compile.build import ensure_default_voice

CLASSES = (
    ("LiveKit", "elevenlabs.TTS"),
    ("LiveKit", "openai.TTS"),
    ("Pipecat", "ElevenLabsTTSService"),
    ("Pipecat", "ElevenLabsHttpTTSService"),
    ("Pipecat", "OpenAITTSService"),
    ("Pipecat", "PiperHttpTTSService"),
)
RATE = 24000
"""Every class's output rate: OpenAI's ``pcm`` is 24 kHz, ElevenLabs' is chosen to match."""
READ_TIMEOUT_S = 120.0
"""Per turn: far above any answer on an idle machine, so only a hung server or client trips it."""
LIBRARIES = ("livekit-agents", "livekit-plugins-elevenlabs", "livekit-plugins-openai",
             "pipecat-ai", "openai", "aiohttp", "websockets")  # fmt: skip


@dataclass
class Sample:
    """Seconds from the end of the first sentence's text to the first and the last audio."""

    first: float
    last: float


class Clock:
    """One turn's stopwatch: ``start`` once the first sentence's last token is in the class,
    ``audio`` at each frame of audio it gives out (the first and the last are kept)."""

    def __init__(self) -> None:
        self.started: float | None = None
        self.first: float | None = None
        self.last: float | None = None

    def start(self) -> None:
        self.started = time.perf_counter()

    def audio(self) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        self.last = now

    def sample(self) -> Sample:
        if self.started is None or self.first is None or self.last is None:
            raise RuntimeError("no audio, or the clock never started")
        if self.first < self.started:
            raise RuntimeError("audio before the first sentence was complete")
        return Sample(self.first - self.started, self.last - self.started)


def tokens(text: str) -> list[str]:
    """Word-sized tokens with their leading space, as an LLM streams them."""
    words = text.split(" ")
    return [words[0], *(" " + word for word in words[1:])]


def first_sentence_end(pieces: list[str]) -> int:
    """Index of the token that ends the first sentence (its full stop, question or exclamation
    mark); the last token where no earlier one does."""
    for i, piece in enumerate(pieces):
        if piece.rstrip().endswith((".", "?", "!")):
            return i
    return len(pieces) - 1


# --------------------------------------------------------------------------- LiveKit


async def livekit_turn(tts: Any, text: str, token_s: float) -> Sample:
    """One reply through a LiveKit streaming TTS (``stream()``), as ``AgentSession`` feeds it,
    a token every ``token_s``."""
    pieces = tokens(text)
    end = first_sentence_end(pieces)
    clock = Clock()
    stream = tts.stream()
    # read as the tokens go in (an agent plays audio while the LLM still writes)
    reading = asyncio.ensure_future(asyncio.wait_for(_livekit_read(stream, clock),
                                                     READ_TIMEOUT_S))  # fmt: skip
    try:
        for i, piece in enumerate(pieces):
            if i and token_s:
                await asyncio.sleep(token_s)  # the LLM writing the next token
            stream.push_text(piece)
            if i == end:
                clock.start()
        stream.flush()
        stream.end_input()
        await reading
    finally:
        reading.cancel()
        await stream.aclose()
    return clock.sample()


async def _livekit_read(stream: Any, clock: Clock) -> None:
    """The turn's audio frames, to the end of its stream."""
    async for event in stream:
        if event.frame.samples_per_channel:
            clock.audio()


async def livekit_classes(stack: AsyncExitStack, server: Server, voice: str) -> dict[str, Any]:
    """LiveKit's two classes, open until ``stack`` closes."""
    import aiohttp  # noqa: PLC0415
    from livekit.agents import tokenize  # noqa: PLC0415
    from livekit.agents import tts as agents_tts  # noqa: PLC0415
    from livekit.plugins import elevenlabs  # noqa: PLC0415
    from livekit.plugins import openai as livekit_openai  # noqa: PLC0415

    http = await stack.enter_async_context(aiohttp.ClientSession())
    eleven = elevenlabs.TTS(base_url=f"{server.base_url}/v1", api_key="unused", voice_id=voice,
                            encoding="pcm_24000", http_session=http)  # fmt: skip
    stack.push_async_callback(eleven.aclose)
    plain = livekit_openai.TTS(base_url=f"{server.base_url}/v1", api_key="unused",
                               model="gpt-4o-mini-tts", voice="alloy",
                               response_format="pcm")  # fmt: skip
    stack.push_async_callback(plain.aclose)
    # what AgentSession puts in front of a TTS that does not stream (livekit/agents/voice/agent.py)
    adapted = agents_tts.StreamAdapter(
        tts=plain, sentence_tokenizer=tokenize.blingfire.SentenceTokenizer(retain_format=True)
    )
    stack.push_async_callback(adapted.aclose)
    return {"elevenlabs.TTS": eleven, "openai.TTS": adapted}


# --------------------------------------------------------------------------- Pipecat


class PipecatSession:
    """One Pipecat pipeline ``[stamp, tts, probe]`` running for the whole benchmark, in this
    process's event loop: ``stamp`` starts the turn's clock once it has pushed the first
    sentence's last token on to the TTS, ``probe`` (after it) sees its audio and the end of the
    turn."""

    def __init__(self, tts: Any) -> None:
        from pipecat.frames.frames import (  # noqa: PLC0415
            Frame,
            LLMFullResponseEndFrame,
            TTSAudioRawFrame,
        )
        from pipecat.pipeline.pipeline import Pipeline  # noqa: PLC0415
        from pipecat.pipeline.worker import PipelineParams, PipelineWorker  # noqa: PLC0415
        from pipecat.processors.frame_processor import (  # noqa: PLC0415
            FrameDirection,
            FrameProcessor,
        )

        session = self
        self.clock = Clock()
        self.watched: Frame | None = None
        self.turn_over = asyncio.Event()
        self.stray = 0
        """Audio frames seen outside a turn: none, or turns overlapped."""

        class Stamp(FrameProcessor):
            async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
                await super().process_frame(frame, direction)
                await self.push_frame(frame, direction)
                if frame is session.watched:
                    session.clock.start()

        class Probe(FrameProcessor):
            async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
                await super().process_frame(frame, direction)
                if isinstance(frame, TTSAudioRawFrame) and frame.audio:
                    if session.turn_over.is_set():
                        session.stray += 1
                    session.clock.audio()
                elif isinstance(frame, LLMFullResponseEndFrame):
                    session.turn_over.set()
                await self.push_frame(frame, direction)

        self.turn_over.set()
        self.worker = PipelineWorker(Pipeline([Stamp(), tts, Probe()]),
                                     params=PipelineParams(audio_out_sample_rate=RATE),
                                     cancel_on_idle_timeout=False)  # fmt: skip
        self.started = asyncio.Event()
        self.running: asyncio.Task[None] | None = None

    async def open(self) -> None:
        from pipecat.workers.runner import WorkerRunner  # noqa: PLC0415

        async def started(worker: Any, frame: Any) -> None:
            self.started.set()

        self.worker.add_event_handler("on_pipeline_started", started)
        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(self.worker)
        self.running = asyncio.create_task(runner.run())
        await asyncio.wait_for(self.started.wait(), READ_TIMEOUT_S)

    async def turn(self, text: str, token_s: float) -> Sample:
        """One reply, a token every ``token_s``, to the end of its audio."""
        from pipecat.frames.frames import (  # noqa: PLC0415
            LLMFullResponseEndFrame,
            LLMFullResponseStartFrame,
            LLMTextFrame,
        )

        pieces = [LLMTextFrame(piece) for piece in tokens(text)]
        self.clock = Clock()
        self.watched = pieces[first_sentence_end([p.text for p in pieces])]
        self.turn_over.clear()
        await self.worker.queue_frame(LLMFullResponseStartFrame())
        for i, frame in enumerate(pieces):
            if i and token_s:
                await asyncio.sleep(token_s)  # the LLM writing the next token
            await self.worker.queue_frame(frame)
        await self.worker.queue_frame(LLMFullResponseEndFrame())
        await asyncio.wait_for(self.turn_over.wait(), READ_TIMEOUT_S)
        return self.clock.sample()

    async def close(self) -> None:
        from pipecat.frames.frames import EndFrame  # noqa: PLC0415

        if self.running is not None:
            await self.worker.queue_frame(EndFrame())
            await asyncio.wait_for(self.running, READ_TIMEOUT_S)


async def pipecat_classes(stack: AsyncExitStack, server: Server, voice: str) -> dict[str, Any]:
    """Pipecat's four classes, each in its running pipeline, until ``stack`` closes."""
    import aiohttp  # noqa: PLC0415
    from openai import DefaultAsyncHttpxClient  # noqa: PLC0415
    from pipecat.services.elevenlabs.tts import (  # noqa: PLC0415
        ElevenLabsHttpTTSService,
        ElevenLabsTTSService,
    )
    from pipecat.services.openai.tts import OpenAITTSService  # noqa: PLC0415
    from pipecat.services.piper.tts import PiperHttpTTSService  # noqa: PLC0415

    http = DefaultAsyncHttpxClient()  # the SDK's client, held open: keep-alive between turns
    stack.push_async_callback(http.aclose)
    session = await stack.enter_async_context(aiohttp.ClientSession())
    services = {
        "ElevenLabsTTSService": ElevenLabsTTSService(
            api_key="unused", url=server.base_url.replace("http://", "ws://"),
            settings=ElevenLabsTTSService.Settings(voice=voice)),
        "ElevenLabsHttpTTSService": ElevenLabsHttpTTSService(
            api_key="unused", base_url=server.base_url, aiohttp_session=session,
            settings=ElevenLabsHttpTTSService.Settings(voice=voice)),
        "OpenAITTSService": OpenAITTSService(
            api_key="unused", base_url=f"{server.base_url}/v1", http_client=http),
        "PiperHttpTTSService": PiperHttpTTSService(
            base_url=f"{server.base_url}/synthesize", aiohttp_session=session,
            settings=PiperHttpTTSService.Settings(voice=voice)),
    }  # fmt: skip
    sessions = {}
    for name, service in services.items():
        pipeline = PipecatSession(service)
        stack.push_async_callback(pipeline.close)
        await pipeline.open()
        sessions[name] = pipeline
    return sessions


# --------------------------------------------------------------------------- the run


async def measure(server: Server, voice: str, text: str, rounds: int, warmup: int,
                  token_s: float) -> dict[tuple[str, str], list[Sample]]:  # fmt: skip
    found: dict[tuple[str, str], list[Sample]] = {kind: [] for kind in CLASSES}
    async with AsyncExitStack() as stack:
        livekit = await livekit_classes(stack, server, voice)
        pipecat = await pipecat_classes(stack, server, voice)
        run: dict[tuple[str, str], Callable[[], Awaitable[Sample]]] = {
            (framework, name): functools.partial(
                livekit_turn, livekit[name], text, token_s) if framework == "LiveKit"
            else functools.partial(pipecat[name].turn, text, token_s)
            for framework, name in CLASSES
        }  # fmt: skip
        kinds = list(CLASSES)
        for i in range(warmup + rounds):
            shift = i % len(kinds)
            for kind in kinds[shift:] + kinds[:shift]:
                sample = await run[kind]()
                if i >= warmup:
                    found[kind].append(sample)
            if i + 1 == warmup or (i >= warmup and (i + 1 - warmup) % 10 == 0):
                done = i + 1 - warmup
                print(f"  {'warm-up done' if done == 0 else f'{done}/{rounds} rounds'}",
                      file=sys.stderr)  # fmt: skip
        stray = {name: s.stray for name, s in pipecat.items() if s.stray}
        if stray:
            raise RuntimeError(f"audio after a turn had ended (turns overlapped): {stray}")
    return found


def summary(values: list[float]) -> dict[str, float | None]:
    ms = [1000 * v for v in values]
    return {"p50_ms": pct(ms, 50), "p90_ms": pct(ms, 90),
            "mean_ms": statistics.fmean(ms) if ms else None}  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| framework | class | n | first audio p50 ms | p90 ms | mean ms "
             "| last audio p50 ms | p90 ms |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        f, last = r["first_audio"], r["last_audio"]
        lines.append(
            f"| {r['framework']} | `{r['class']}` | {r['n']} | {fmt(f['p50_ms'])} "
            f"| {fmt(f['p90_ms'])} | {fmt(f['mean_ms'])} | {fmt(last['p50_ms'])} "
            f"| {fmt(last['p90_ms'])} |"
        )
    return "\n".join(lines)


def quiet_frameworks() -> None:
    """Pipecat logs every frame's journey at DEBUG through loguru, and its modules use what it
    (and Python) deprecated: keep stderr for this script's progress and real warnings."""
    try:
        from loguru import logger  # noqa: PLC0415
    except ImportError:
        return
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    warnings.filterwarnings("ignore", category=DeprecationWarning)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--rounds",
        type=int,
        default=20,
        help="measured rounds, each one turn through every class (default 20)",
    )
    parser.add_argument(
        "--warmup", type=int, default=2, help="rounds run first and not counted (default 2)"
    )
    parser.add_argument(
        "--engines-dir",
        type=Path,
        default=DEFAULT_ENGINES,
        help=f"engines directory (default: {relative(DEFAULT_ENGINES)})",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker processes (default: the service's own choice)",
    )
    parser.add_argument(
        "--corpus",
        type=Path,
        default=DEFAULT_CORPUS,
        help=f"where the default text comes from (default: {relative(DEFAULT_CORPUS)})",
    )
    parser.add_argument(
        "--text",
        default=None,
        help="the reply, several sentences (default: the corpus's first three "
        "lines, agents_bench.py's long reply)",
    )
    parser.add_argument(
        "--token-ms",
        type=float,
        default=25.0,
        help="the LLM's pace: milliseconds between tokens (default 25: 40 tokens a second; "
        "0: all at once)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=RESULTS / "agent_plugins_bench.json",
        help="JSON result; the markdown goes next to it as .md "
        "(default: benchmarks/results/agent_plugins_bench.json)",
    )
    args = parser.parse_args()

    text = args.text or " ".join(load_corpus(args.corpus)[:3])
    quiet_frameworks()
    ensure_default_voice(args.engines_dir, lambda m: print(m, file=sys.stderr))
    load_before = os.getloadavg()
    server = Server(args.engines_dir, args.workers, SERVER_LOG_DIR / "agent_plugins_bench.log",
                    extra_args=["--metrics-port", "0"])  # fmt: skip
    try:
        server.wait_ready(lambda c: c.get("/health").status_code == 200, timeout_s=600,
                          poll_timeout_s=1, interval_s=0.2)  # fmt: skip
        workers = server.worker_count()
        with httpx.Client(base_url=server.base_url, timeout=30, trust_env=False) as client:
            voice = client.get("/voices").json()["voices"][0]["name"]  # the default comes first
        found = asyncio.run(measure(server, voice, text, args.rounds, args.warmup,
                                    args.token_ms / 1000))  # fmt: skip
    finally:
        code = server.stop()
    load_after = os.getloadavg()

    rows: list[dict[str, Any]] = []
    for framework, name in CLASSES:
        samples = found[(framework, name)]
        rows.append({"framework": framework, "class": name, "n": len(samples),
                     "first_audio": summary([s.first for s in samples]),
                     "last_audio": summary([s.last for s in samples])})  # fmt: skip
    machine = machine_info({lib: version(lib) for lib in LIBRARIES})
    header = (
        f"From the end of the first sentence's text (its last token handed to the class) to "
        f"the first and the last audio frame out of it, {args.rounds} rounds after "
        f"{args.warmup} warm-up, {workers} worker(s), pcm at {RATE} Hz, voice {voice}, a "
        f"token every {args.token_ms:g} ms; "
        f"{machine['cpu_model']}, {machine['cpu_count']} CPUs; load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after.\n\n"
        f"- reply ({len(text)} characters, token by token): {text!r}\n"
        f"- livekit-agents {machine['livekit-agents']}, pipecat-ai {machine['pipecat-ai']}\n"
    )
    markdown = f"{header}\n{table(rows)}\n"
    print(markdown)
    report = {
        "benchmark": "agent_plugins_bench",
        "timestamp": utc_timestamp(),
        "machine": machine,
        "args": {"rounds": args.rounds, "warmup": args.warmup, "workers": workers,
                 "token_ms": args.token_ms},
        "text": text,
        "voice": voice,
        "load_average_1m": {"before": load_before[0], "after": load_after[0]},
        "server_exit_code": code,
        "rows": rows,
    }
    write_json(args.out, report, indent=2)
    write_atomic(args.out.with_suffix(".md"), markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
