"""espeak-ng phonemes and Piper ids, exactly as the default voice was trained.

The voice (``piper_version`` 1.0.0) was trained on phonemes from ``piper-phonemize``'s espeak-ng
1.51 fork. ``piper-phonemize-fix`` is the same code with wheels for CPython 3.10-3.13, and its
output was measured identical to ``piper-phonemize`` 1.1.0; ``piper-tts`` 1.8 bundles espeak-ng
1.52, whose vowels differ in about 40 % of sentences (e.g. ``stˈɔːɹ`` for ``stˈoːɹ``), so it is
not used.

That espeak-ng overflows fixed-size buffers on some inputs and then kills the process it runs in.
Normalization removes the shapes known to do it, but a crash inside a worker would cut every stream
the worker carries, so espeak-ng runs in a child process of its own (``ttsvc.text.espeak_child``):
a crash or a hang costs the one request whose text caused it a 422, and the next call starts a
fresh child. espeak-ng keeps global state and is not re-entrant, so one lock serializes the calls.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import unicodedata
from collections.abc import Mapping, Sequence
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from pathlib import Path

from ttsvc.errors import UnspeakableText
from ttsvc.observability.logs import get_logger

PAD = "_"
BOS = "^"
EOS = "$"

CALL_TIMEOUT_S = 3.0
"""An answer later than this is a hung espeak-ng: far beyond a normal sentence (milliseconds), and
short of the worker heartbeat timeout, so a hang fails one request, not the whole worker."""
START_TIMEOUT_S = 60.0
"""A child that has not loaded espeak-ng by then is not coming (a loaded machine takes seconds)."""

log = get_logger("phonemizer")


class EspeakProcess:
    """espeak-ng in a child process owned by this one, started on first use and again at once
    after each failure.

    Safe to share between threads. The child ends when its pipe closes, so it never outlives its
    owner, even one killed with SIGKILL.
    """

    def __init__(
        self, call_timeout_s: float = CALL_TIMEOUT_S, start_timeout_s: float = START_TIMEOUT_S
    ) -> None:
        self.call_timeout_s = call_timeout_s
        self.start_timeout_s = start_timeout_s
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._owner = 0
        """The process that started the child: a forked copy of this object must not share it."""

    @property
    def pid(self) -> int | None:
        """The child's process id; ``None`` until the next call starts one."""
        return None if self._proc is None else self._proc.pid

    def sentences(self, text: str, voice: str) -> list[str]:
        """espeak-ng's phonemes for ``text``, one string per sentence it finds.

        Raises ``UnspeakableText`` when espeak-ng crashes or hangs on ``text``.
        """
        with self._lock:
            if self._owner != os.getpid():
                self._conn = self._proc = None  # inherited through fork: the parent's child
            elif self._proc is not None and self._proc.poll() is not None:
                self._stop()  # died between calls (killed from outside): not this text's fault
            conn = self._conn if self._conn is not None else self._start()
            try:
                conn.send_bytes(json.dumps([text, voice]).encode())
                if not conn.poll(self.call_timeout_s):
                    raise TimeoutError(f"no answer within {self.call_timeout_s:g} s")
                reply = json.loads(conn.recv_bytes())
                if not isinstance(reply, dict):
                    raise ValueError(f"not an answer: {reply!r:.80}")
            except (OSError, EOFError, ValueError) as exc:
                exitcode = self._stop()
                log.warning("phonemizer_failed", exitcode=exitcode, text_chars=len(text),
                            reason=type(exc).__name__)  # fmt: skip
                self._restart()
                raise UnspeakableText(
                    "the phonemizer failed on this text; it cannot be spoken", field="text"
                ) from exc
        sentences = reply.get("sentences")
        if not isinstance(sentences, list):  # espeak-ng raised: a bad voice, not a bad text
            raise RuntimeError(f"espeak-ng failed for voice {voice!r}: {reply.get('error')}")
        return [str(s) for s in sentences]

    def close(self) -> None:
        """Stop the child now (the next call would start another)."""
        with self._lock:
            self._stop()

    def _restart(self) -> None:
        """Start the replacement now: the request that broke the child waits for it, not the
        next one. A failed start is left for the next call to report."""
        try:
            self._start()
        except RuntimeError:
            log.exception("phonemizer_start_failed")

    def _start(self) -> Connection:
        ours, theirs = Pipe()
        # the child must import this very ttsvc, wherever it was imported from
        root = str(Path(__file__).resolve().parents[2])
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        fd = theirs.fileno()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "ttsvc.text.espeak_child", str(fd)],
            pass_fds=(fd,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # espeak-ng may print; the owner's stdout is its log
            env={**os.environ, "PYTHONPATH": path},
        )
        theirs.close()
        self._conn, self._owner = ours, os.getpid()
        try:
            ready = ours.poll(self.start_timeout_s) and json.loads(ours.recv_bytes())
        except (OSError, EOFError, ValueError):
            ready = False
        if not ready:
            exitcode = self._stop()
            raise RuntimeError(f"the espeak-ng process did not start (exit code {exitcode})")
        return ours

    def _stop(self) -> int | None:
        """End the child (killed if still running) and return its exit code."""
        conn, proc = self._conn, self._proc
        self._conn = self._proc = None
        if conn is not None:
            conn.close()
        if proc is None:
            return None
        if proc.poll() is None:
            proc.kill()
        return proc.wait()


_ESPEAK = EspeakProcess()
"""This process's espeak-ng child, shared by every caller (compute loop and staging threads)."""


def close_phonemizer() -> None:
    """Stop this process's espeak-ng child now, for a process that is about to exit: the child
    inherited its standard error, so a relay of file descriptor 2 (``NativeRelay``) sees the
    pipe's end only once the child is gone as well."""
    _ESPEAK.close()


def phonemize(text: str, espeak_voice: str) -> list[list[str]]:
    """Phonemes of ``text``, one list per sentence espeak-ng finds in it.

    Each phoneme is one Unicode code point after NFD decomposition, as Piper splits them. Raises
    ``UnspeakableText`` when espeak-ng crashes or hangs on ``text``.
    """
    return [
        list(unicodedata.normalize("NFD", sentence))
        for sentence in _ESPEAK.sentences(text, espeak_voice)
        if sentence.strip()
    ]


def phoneme_ids(phonemes: Sequence[str], id_map: Mapping[str, Sequence[int]]) -> list[int]:
    """Map phonemes to ids with Piper's rules: BOS, a pad after every phoneme, EOS.

    Phonemes missing from the voice's map are dropped, as Piper drops them: the voice has never
    seen them and has no id to give.
    """
    pad = list(id_map[PAD])
    ids = [*id_map[BOS], *pad]
    for phoneme in phonemes:
        mapped = id_map.get(phoneme)
        if mapped is None:
            continue
        ids.extend(mapped)
        ids.extend(pad)
    ids.extend(id_map[EOS])
    return ids
