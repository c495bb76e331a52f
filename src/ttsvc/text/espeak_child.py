"""The process that runs espeak-ng for ``ttsvc.text.phonemize``, fed only by its parent's pipe.

espeak-ng can crash on some inputs (fixed-size buffers in its word translation), so it runs here,
alone, and a crash ends only this process. One request at a time: a JSON ``[text, voice]`` in,
a JSON ``{"sentences": [...]}`` (each sentence's phonemes joined) or ``{"error": ...}`` out.
The process ends when its parent closes the pipe, which also happens when the parent dies.
"""

from __future__ import annotations

import json
import signal
import sys
from multiprocessing.connection import Connection


def _default_signals() -> None:
    """The worker ignores SIGTERM and SIGINT, and this process inherited that: the defaults come
    back so a plain ``kill`` ends it (a child hung in espeak-ng never reads its pipe's EOF).

    Not ``PR_SET_PDEATHSIG``: the kernel ties it to the thread that started this process, and a
    child started from a worker's short-lived thread would die under another thread's call.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def serve(conn: Connection) -> None:
    """Answer requests on ``conn`` until the parent closes it."""
    from piper_phonemize import phonemize_espeak  # noqa: PLC0415 - only this process loads it

    phonemize_espeak("ready", "en-us")  # loads espeak-ng's data before the parent's first request
    conn.send_bytes(b'{"ready": true}')
    while True:
        try:
            text, voice = json.loads(conn.recv_bytes())
        except EOFError:
            return
        try:
            sentences = ["".join(s) for s in phonemize_espeak(text, voice)]
        except Exception as exc:  # a Python-level failure (a bad voice) goes back as an answer
            reply: dict[str, object] = {"error": f"{type(exc).__name__}: {exc}"}
        else:
            reply = {"sentences": sentences}
        conn.send_bytes(json.dumps(reply).encode())


if __name__ == "__main__":
    _default_signals()
    serve(Connection(int(sys.argv[1])))
