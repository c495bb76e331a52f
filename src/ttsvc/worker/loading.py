"""Loading engine sets in a worker: the voice at start, a swap's candidate, a voice on demand.

Why a module of its own: a load is the slow, failure-prone part of a worker's life (files read
and checked, sessions built, the canary run, costs measured or taken over from a set built
alike), and none of it belongs to the loop that serves the pipe. ``load`` does one load in the
calling thread; ``Loader`` runs loads beside the serving engines, one thread each, and queues
what came of them for the worker's main loop (``worker.process``) to act on, so no stream
stalls while a voice loads.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

from ttsvc.errors import EngineError
from ttsvc.protocol import EngineSpec, SwapEngines
from ttsvc.repository.manifest import Manifest
from ttsvc.synthesis import Synthesizer, canary_failure
from ttsvc.windows import WindowSchedule
from ttsvc.worker.voices import VoiceSet, spec_bytes


def load(
    spec: EngineSpec,
    threads: int,
    schedule: WindowSchedule,
    max_sentence_chars: int,
    cost: tuple[float, float, float] = (0.0, 0.0, 0.0),
    canary: bool = True,
) -> Synthesizer:
    """Load, warm up and calibrate an engine set; raise if its canary fails.

    A swap passes the serving engines' measured costs per frame (flow and vocoder together, and
    the flow's part): the new set runs the same architecture on the same machine, and measuring
    again would compete with live streams. Stateful engines measure anyway (their per-call cost
    is not among those passed, and the serving set may be of the other kind): about 0.2 s of
    one core. A voice loaded for a request skips the canary
    (``canary=False``): a staging worker already ran it on these exact bytes (the load still
    checks every file's sha256), and the request is waiting.
    """
    # imported here, in the worker: a process that imports the worker's modules without running
    # one (the gateway names its spawn target) must not carry an inference runtime it never runs
    # (20 MB RSS for ORT alone)
    from ttsvc.backends.loader import load_engine_spec  # noqa: PLC0415

    synth = Synthesizer(load_engine_spec(spec, threads), schedule,
                        max_sentence_chars)  # fmt: skip
    try:
        failure = canary_failure(synth) if canary else None  # also the warm-up: first allocations
    except MemoryError:
        raise  # the process's limit, not the engines' fault
    except Exception as exc:  # a graph that parses but cannot run (shapes, operators)
        failure = f"{type(exc).__name__}: {str(exc)[:200]}"
    if failure is not None:
        raise EngineError(f"{spec.source} ({spec.label}): {failure}",
                          reason=f"canary synthesis failed: {failure}")  # fmt: skip
    if cost[0] > 0 and not synth.stateful:  # frame cost, flow's share of it, acoustic cost per id
        synth.frame_cost_s, synth.flow_cost_s, synth.acoustic_cost_s = cost
        synth.vocoder_cost_s = cost[0] - cost[1]
    else:
        synth.calibrate()  # window sizes then follow this machine's real speed
    return synth


def measured_costs(synth: Synthesizer) -> tuple[float, float, float]:
    """The measured costs a candidate engine set takes over from the serving one."""
    return synth.frame_cost_s, synth.flow_cost_s, synth.acoustic_cost_s


Outcome = Synthesizer | tuple[str, str]
"""A loaded and canaried engine set, or why not: (reason for clients, detail for the log)."""


@dataclass
class Loader:
    """Loads engine sets off the main loop, one thread per load, and queues what came of each:
    a swap's candidate (its ``SwapEngines``) or a voice a request needs (its ``EngineSpec``)."""

    threads: int
    schedule: WindowSchedule
    max_sentence_chars: int
    done: queue.SimpleQueue[tuple[SwapEngines | EngineSpec, Outcome, float]] = field(
        default_factory=queue.SimpleQueue
    )
    demand: str | None = None
    """The voice being loaded for waiting requests (one at a time)."""
    started: dict[int, float] = field(default_factory=dict)
    """Loads in progress (by their request's id) and when each started; kept by the main loop,
    which starts and finishes them. Meanwhile it polls its pipe briefly, so waiting requests
    start as soon as their voice is in."""

    def start(self, request: SwapEngines | EngineSpec, cost: tuple[float, float, float]) -> None:
        """Load ``request``'s engines beside the serving ones (a swap's candidate also runs the
        canary): the streams this worker is serving do not stall while it loads."""
        self.started[id(request)] = time.monotonic()
        threading.Thread(target=self._run, args=(request, cost), daemon=True).start()

    def _run(self, request: SwapEngines | EngineSpec, cost: tuple[float, float, float]) -> None:
        swap = isinstance(request, SwapEngines)
        spec = request.spec if isinstance(request, SwapEngines) else request
        started = time.perf_counter()
        outcome: Outcome
        try:
            outcome = load(spec, self.threads, self.schedule, self.max_sentence_chars, cost,
                           canary=swap)  # fmt: skip
        except Exception as exc:  # a bad candidate must never take the worker down
            # strings only: the exception's traceback would keep the failed candidate's
            # frames, and with them its loaded engines, alive until the next swap. The gateway
            # answers clients with the public reason; the detail is for its log.
            public = exc.public() if isinstance(exc, EngineError) else "could not be loaded"
            outcome = (public, str(exc))
        self.done.put((request, outcome, time.perf_counter() - started))


ALIKE = 0.2
"""How far (as a share) two voices' engine sizes may differ for one's measured costs to stand
for the other's: Piper voices of one quality share their architecture, so their steps cost the
same; another quality is measured."""


def alike_costs(held: VoiceSet[Synthesizer], spec: EngineSpec) -> tuple[float, float, float]:
    """The costs of a held voice built like ``spec`` (same latent and hop, engine sizes within
    ``ALIKE``), or zeros: measure them (a few hundred milliseconds the request waits)."""
    wanted = Manifest.model_validate_json(spec.manifest)
    size = spec_bytes(spec)
    for synth, _ in held.held.values():
        manifest = synth.engines.manifest
        held_size = sum(entry.size for entry in manifest.files.values())
        if (manifest.latent_channels == wanted.latent_channels
                and manifest.hop_length == wanted.hop_length
                and abs(held_size - size) <= ALIKE * size):  # fmt: skip
            return measured_costs(synth)
    return 0.0, 0.0, 0.0
