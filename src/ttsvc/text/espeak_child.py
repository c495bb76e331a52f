"""The process that runs espeak-ng for ``ttsvc.text.phonemize``, fed only by its parent's pipe.

espeak-ng can crash on some inputs (fixed-size buffers in its word translation), so it runs here,
alone, and a crash ends only this process. One request at a time: a JSON ``[text, voice]`` in,
a JSON ``{"sentences": [...]}`` (each sentence's phonemes joined) or ``{"error": ...}`` out.
The process ends when its parent closes the pipe, which also happens when the parent dies.
"""

from __future__ import annotations

import json
import sys
from multiprocessing.connection import Connection


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
    serve(Connection(int(sys.argv[1])))
