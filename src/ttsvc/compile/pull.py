"""Pull a catalogue voice: download its model and config, check them, compile and publish.

The files land in a dot-directory inside the engines directory (never listed as a voice, and on
the same filesystem as what is published), are held to the catalogue's size and md5 before
anything is compiled, and the directory goes in every case. The compile is ``ttsvc compile``'s
own (``compile_voice``), which publishes atomically: a failed pull leaves the engines that serve
untouched.
"""

from __future__ import annotations

import errno
import hashlib
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import httpx

from ttsvc.compile.build import compile_voice
from ttsvc.compile.inputs import CompileOptions
from ttsvc.repository.catalogue import (
    Catalogue,
    CatalogueFile,
    FetchError,
    file_url,
    too_many_redirects,
)
from ttsvc.repository.layout import EngineVersion
from ttsvc.voice import name_problem
from ttsvc.windows import WindowSchedule

PULL_PREFIX = ".pull-"
CHUNK = 1 << 20


def _write(out: BinaryIO, chunk: bytes) -> None:
    """One chunk to disk (its own function: the tests inject a full disk here)."""
    out.write(chunk)


def download(client: httpx.Client, url: str, expected: CatalogueFile, dest: Path) -> None:
    """Stream ``url`` into ``dest`` and hold it to the catalogue's size and md5."""
    md5, size = hashlib.md5(usedforsecurity=False), 0
    try:
        with client.stream("GET", url) as response, dest.open("wb") as out:
            if response.status_code != 200:
                raise FetchError(f"HTTP {response.status_code} for {url}")
            for chunk in response.iter_bytes(CHUNK):
                _write(out, chunk)
                md5.update(chunk)
                size += len(chunk)
    except httpx.TooManyRedirects as exc:
        raise too_many_redirects(url) from exc
    except httpx.RemoteProtocolError as exc:
        raise FetchError(f"download of {url} cut short after {size} of {expected.size_bytes} "
                         f"bytes (connection closed: {exc})") from exc  # fmt: skip
    except httpx.HTTPError as exc:
        raise FetchError(f"download of {url} failed after {size} of {expected.size_bytes} "
                         f"bytes: {exc or type(exc).__name__}") from exc  # fmt: skip
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise FetchError(f"disk full writing {dest} ({size} of {expected.size_bytes} bytes "
                             "written)") from exc  # fmt: skip
        raise FetchError(f"cannot write {dest}: {exc}") from exc
    if size != expected.size_bytes:
        raise FetchError(f"{expected.path}: size {size} bytes, the catalogue says "
                         f"{expected.size_bytes} (download cut short?)")  # fmt: skip
    if md5.hexdigest() != expected.md5_digest:
        raise FetchError(f"{expected.path}: md5 {md5.hexdigest()} does not match the "
                         f"catalogue's {expected.md5_digest}: refused")  # fmt: skip


def pull_voice(
    catalogue: Catalogue,
    name: str,
    engines_dir: Path,
    client: httpx.Client,
    log: Callable[[str], None] = lambda _msg: None,
    schedule: WindowSchedule | None = None,
) -> EngineVersion:
    """Download, check, compile and publish catalogue voice ``name`` into ``engines_dir``."""
    voice = catalogue.find(name)
    problem = name_problem(voice.name)  # ``Catalogue.parse`` set such entries aside; not all do
    if problem is not None:
        raise FetchError(f"{problem}: refused")
    engines_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=PULL_PREFIX, dir=engines_dir))
    try:
        model, config = workdir / f"{voice.name}.onnx", workdir / f"{voice.name}.onnx.json"
        for entry, dest in ((voice.file(".onnx"), model), (voice.file(".onnx.json"), config)):
            url = file_url(catalogue.base, entry.path)
            log(f"download {url} ({entry.size_bytes / 1e6:.1f} MB)")
            download(client, url, entry, dest)
        log(f"{voice.name}: size and md5 match the catalogue; compiling")
        options = CompileOptions(model, config, engines_dir, voice.name, log=log,
                                 schedule=schedule or WindowSchedule())  # fmt: skip
        try:
            return compile_voice(options)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:  # the compile removed its staging directory
                raise FetchError(f"disk full compiling {voice.name} in {engines_dir}") from exc
            raise
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
