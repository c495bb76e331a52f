"""The public Piper voice catalogue (rhasspy/piper-voices' ``voices.json``) and where its files are.

A voice is pulled by its catalogue name, so the catalogue is read here once, into typed entries
whose files carry the size and md5 the download is checked against. The base URL is a setting:
a company network points it at its own mirror of the same layout (``{base}/voices.json``,
``{base}/{file path}``).
"""

from __future__ import annotations

import difflib
import os

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

DEFAULT_BASE_URL = "https://huggingface.co/rhasspy/piper-voices/resolve/v1.0.0"
BASE_URL_ENV = "TTSVC_VOICES_URL"
CATALOGUE_FILE = "voices.json"
TIMEOUT = httpx.Timeout(30.0, connect=10.0)
"""Per read, not per download: a slow mirror is fine while bytes keep coming."""


class FetchError(Exception):
    """A catalogue or voice file that could not be fetched or checked, said in one line."""


class UnknownCatalogueVoice(FetchError):
    """A name the catalogue does not list."""


class CatalogueFile(BaseModel):
    """One file of a voice: its path under the base URL, size and md5."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    path: str = ""
    size_bytes: int
    md5_digest: str


class Language(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    code: str
    name_english: str = ""


class CatalogueVoice(BaseModel):
    """One voice of the catalogue."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str = Field(alias="key")
    language: Language
    quality: str = ""
    num_speakers: int = 1
    files: dict[str, CatalogueFile]
    aliases: list[str] = []

    def file(self, suffix: str) -> CatalogueFile:
        """The file whose path ends with ``suffix`` (``.onnx``, ``.onnx.json``)."""
        for path, entry in self.files.items():
            if path.endswith(suffix):
                return entry.model_copy(update={"path": path})
        raise FetchError(f"the catalogue lists no {suffix} file for {self.name}")


def base_url(flag: str | None = None) -> str:
    """The catalogue's base: the flag, else ``TTSVC_VOICES_URL``, else the public repository."""
    return (flag or os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL).rstrip("/")


def file_url(base: str, path: str) -> str:
    return f"{base.rstrip('/')}/{path.lstrip('/')}"


class Catalogue:
    """The voices of one ``voices.json``, by name."""

    def __init__(self, base: str, voices: dict[str, CatalogueVoice]) -> None:
        self.base, self.voices = base, voices

    @classmethod
    def parse(cls, base: str, raw: object) -> Catalogue:
        if not isinstance(raw, dict):
            raise FetchError(f"{file_url(base, CATALOGUE_FILE)}: not a JSON object")
        try:
            voices = {name: CatalogueVoice.model_validate(entry) for name, entry in raw.items()}
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise FetchError(f"{file_url(base, CATALOGUE_FILE)}: {where}: {first['msg']}") from exc
        return cls(base, voices)

    def find(self, name: str) -> CatalogueVoice:
        """The voice called ``name`` (or one of its aliases); else the near names, in one line."""
        if name in self.voices:
            return self.voices[name]
        for voice in self.voices.values():
            if name in voice.aliases:
                return voice
        near = difflib.get_close_matches(name, list(self.voices), n=5, cutoff=0.6)
        hint = f"; did you mean {', '.join(near)}?" if near else ""
        where = file_url(self.base, CATALOGUE_FILE)
        raise UnknownCatalogueVoice(f"{name}: no such voice in {where}{hint}")

    def listing(self, language: str = "") -> list[CatalogueVoice]:
        """Voices sorted by name, those whose language code starts with ``language``."""
        return [v for _, v in sorted(self.voices.items()) if v.language.code.startswith(language)]


def fetch_catalogue(client: httpx.Client, base: str) -> Catalogue:
    """Read ``{base}/voices.json``; an unreachable or broken catalogue is one ``FetchError``."""
    url = file_url(base, CATALOGUE_FILE)
    try:
        response = client.get(url)
        response.raise_for_status()
        raw = response.json()
    except httpx.HTTPStatusError as exc:
        raise FetchError(
            f"catalogue unavailable: HTTP {exc.response.status_code} for {url}"
        ) from exc
    except httpx.HTTPError as exc:
        raise FetchError(f"catalogue unreachable: {url}: {exc or type(exc).__name__}") from exc
    except ValueError as exc:
        raise FetchError(f"{url}: not JSON: {exc}") from exc
    return Catalogue.parse(base, raw)


def client() -> httpx.Client:
    """The HTTP client a pull uses: redirects followed (Hugging Face answers with its CDN)."""
    return httpx.Client(timeout=TIMEOUT, follow_redirects=True)
