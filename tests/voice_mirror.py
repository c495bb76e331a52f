"""A loopback copy of the Piper voice repository's layout, for ``ttsvc voices`` tests.

It serves ``voices.json`` and the packaged default voice's files under another voice's name, so
a pull compiles a voice no engines directory has; its faults (a missing file, a cut download, a
file whose bytes differ from the catalogue's md5, a redirect) are switched per path, and
``hostile_files`` adds catalogue entries whose names are paths.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from ttsvc.compile.build import default_checkpoint

TEST_VOICE = "en_US-testvoice-medium"
VOICE_DIR = "en/en_US/testvoice/medium"
MODEL_PATH = f"{VOICE_DIR}/{TEST_VOICE}.onnx"
CONFIG_PATH = f"{VOICE_DIR}/{TEST_VOICE}.onnx.json"
PREFIX = "/piper-voices/resolve/v1.0.0/"
"""The base URL's path, as a mirror of the repository's layout would have one."""


def _entry(data: bytes) -> dict[str, object]:
    return {"size_bytes": len(data), "md5_digest": hashlib.md5(data).hexdigest()}


def _voice(name: str, code: str, files: dict[str, bytes]) -> dict[str, object]:
    family, region = code.split("_")
    return {
        "key": name,
        "name": name.split("-")[1],
        "language": {
            "code": code,
            "family": family,
            "region": region,
            "name_native": family,
            "name_english": family,
            "country_english": region,
        },
        "quality": name.rsplit("-", 1)[1],
        "num_speakers": 1,
        "speaker_id_map": {},
        "files": {path: _entry(data) for path, data in files.items()},
        "aliases": [],
    }


@dataclass
class Mirror:
    """What the server serves: ``files`` by path; ``cut`` paths send half their bytes under the
    full Content-Length and close; ``missing`` paths answer 404; ``redirects`` paths answer 302
    to their ``Location``. ``requests``: every path asked for, in order."""

    files: dict[str, bytes]
    cut: set[str] = field(default_factory=set)
    missing: set[str] = field(default_factory=set)
    redirects: dict[str, str] = field(default_factory=dict)
    base: str = ""
    requests: list[str] = field(default_factory=list)


def mirror_files() -> dict[str, bytes]:
    """The catalogue and the test voice's files (the packaged voice's bytes), plus a second,
    German, catalogue entry whose files are never fetched."""
    model, config = (Path(p).read_bytes() for p in default_checkpoint())
    catalogue = {
        TEST_VOICE: _voice(
            TEST_VOICE,
            "en_US",
            {MODEL_PATH: model, CONFIG_PATH: config, f"{VOICE_DIR}/MODEL_CARD": b"card"},
        ),
        "de_DE-thorsten-high": _voice(
            "de_DE-thorsten-high",
            "de_DE",
            {"de/de_DE/thorsten/high/de_DE-thorsten-high.onnx": b"x"},
        ),
    }
    return {"voices.json": json.dumps(catalogue).encode(), MODEL_PATH: model, CONFIG_PATH: config}


def hostile_files(
    files: dict[str, bytes], key: str, entry_key: str | None = None, aliases: tuple[str, ...] = ()
) -> dict[str, bytes]:
    """``files`` whose catalogue also lists the test voice's files (md5 and all, so only the name
    is wrong) under ``key``, the entry's own ``key`` being ``entry_key`` (default: ``key``)."""
    catalogue = json.loads(files["voices.json"])
    entry = dict(catalogue[TEST_VOICE])
    entry["key"], entry["aliases"] = entry_key or key, list(aliases)
    catalogue[key] = entry
    return files | {"voices.json": json.dumps(catalogue).encode()}


@contextmanager
def serve_mirror(mirror: Mirror) -> Iterator[Mirror]:
    """``mirror`` on 127.0.0.1 in a thread; ``mirror.base`` is its base URL while it runs."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.removeprefix(PREFIX)
            mirror.requests.append(path)
            if path in mirror.redirects:
                self.send_response(302)
                self.send_header("Location", mirror.redirects[path])
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if path not in mirror.files or path in mirror.missing:
                self.send_error(404)
                return
            data = mirror.files[path]
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2] if path in mirror.cut else data)
            self.close_connection = True

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    mirror.base = f"http://127.0.0.1:{server.server_address[1]}{PREFIX.rstrip('/')}"
    try:
        yield mirror
    finally:
        server.shutdown()
        server.server_close()
