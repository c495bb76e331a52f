"""The public Piper voice catalogue (rhasspy/piper-voices' ``voices.json``) and where its files are.

A voice is pulled by its catalogue name, so the catalogue is read here once, into typed entries
whose files carry the size and md5 the download is checked against. The base URL is a setting:
a company network points it at its own mirror of the same layout (``{base}/voices.json``,
``{base}/{file path}``).

A catalogue is input from the network: an entry whose name is not a voice name (a path, say) is
set aside, never used, and said when asked for; and the client follows at most
``MAX_REDIRECTS`` redirects, each to https or within the origin that redirected (Hugging Face
redirects to its https CDN), so a plain-http mirror cannot send a pull to another host in the
clear. The md5 still decides what is published; these rules decide where a pull may go.
"""

from __future__ import annotations

import difflib
import os

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ttsvc.voice import name_problem

DEFAULT_BASE_URL = "https://huggingface.co/rhasspy/piper-voices/resolve/v1.0.0"
BASE_URL_ENV = "TTSVC_VOICES_URL"
CATALOGUE_FILE = "voices.json"
TIMEOUT = httpx.Timeout(30.0, connect=10.0)
"""Per read, not per download: a slow mirror is fine while bytes keep coming."""
MAX_REDIRECTS = 5
"""Hugging Face answers a file with one redirect to its CDN; a longer chain is a loop or a
misconfigured mirror."""


class FetchError(Exception):
    """A catalogue or voice file that could not be fetched or checked, said in one line."""


class UnknownCatalogueVoice(FetchError):
    """A name the catalogue does not list."""


class RedirectRefused(FetchError):
    """A redirect off the origin over plain http, or past ``MAX_REDIRECTS``."""


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
    """The voices of one ``voices.json``, by name; ``refused``: why each entry set aside was,
    by every name it could be asked for (its key, its own ``key``, its aliases)."""

    def __init__(
        self, base: str, voices: dict[str, CatalogueVoice], refused: dict[str, str] | None = None
    ) -> None:
        self.base, self.voices, self.refused = base, voices, refused or {}

    @classmethod
    def parse(cls, base: str, raw: object) -> Catalogue:
        if not isinstance(raw, dict):
            raise FetchError(f"{file_url(base, CATALOGUE_FILE)}: not a JSON object")
        voices: dict[str, CatalogueVoice] = {}
        refused: dict[str, str] = {}
        for name, entry in raw.items():
            try:
                voice = CatalogueVoice.model_validate(entry)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(part) for part in [name, *first["loc"]])
                raise FetchError(
                    f"{file_url(base, CATALOGUE_FILE)}: {where}: {first['msg']}"
                ) from exc
            problem = name_problem(name) or name_problem(voice.name)
            if problem is None:
                voices[name] = voice
                continue
            why = f"{file_url(base, CATALOGUE_FILE)}: entry refused: {problem}"
            refused |= {alias: why for alias in (name, voice.name, *voice.aliases)}
        return cls(base, voices, refused)

    @property
    def skipped(self) -> list[str]:
        """Why each entry set aside was, once per entry."""
        return list(dict.fromkeys(self.refused.values()))

    def find(self, name: str) -> CatalogueVoice:
        """The voice called ``name`` (or one of its aliases); else the near names, in one line."""
        if name in self.voices:
            return self.voices[name]
        for voice in self.voices.values():
            if name in voice.aliases:
                return voice
        if name in self.refused:
            raise FetchError(self.refused[name])
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
    except httpx.TooManyRedirects as exc:
        raise too_many_redirects(url) from exc
    except httpx.HTTPError as exc:
        raise FetchError(f"catalogue unreachable: {url}: {exc or type(exc).__name__}") from exc
    except ValueError as exc:
        raise FetchError(f"{url}: not JSON: {exc}") from exc
    return Catalogue.parse(base, raw)


def too_many_redirects(url: str) -> RedirectRefused:
    return RedirectRefused(f"{url}: more than {MAX_REDIRECTS} redirects: refused")


def redirect_problem(source: httpx.URL, target: httpx.URL) -> str | None:
    """``None`` for a redirect the client may follow: to https, or within ``source``'s origin
    (same scheme, host and port); else why not, in one line."""
    if target.scheme == "https" or (target.scheme, target.host, target.port) == (
        source.scheme, source.host, source.port,
    ):  # fmt: skip
        return None
    origin = f"{source.scheme}://{source.netloc.decode()}"
    return (f"redirect from {source} to {target} refused: a redirect is followed only to https "
            f"or within {origin}")  # fmt: skip


def _check_redirect(response: httpx.Response) -> None:
    """A response hook: refuse a redirect before it is followed (where httpx would go: the
    ``Location`` resolved against the URL redirected from)."""
    if not response.has_redirect_location:
        return
    source = response.request.url
    location = httpx.URL(response.headers["Location"])
    if location.scheme and not location.host:  # "http:/path": httpx keeps the host
        location = location.copy_with(host=source.host)
    problem = redirect_problem(source, source.join(location))
    if problem is not None:
        raise RedirectRefused(problem)


def client() -> httpx.Client:
    """The HTTP client a pull uses: redirects followed as ``redirect_problem`` allows, at most
    ``MAX_REDIRECTS`` (Hugging Face answers with its https CDN)."""
    return httpx.Client(timeout=TIMEOUT, follow_redirects=True, max_redirects=MAX_REDIRECTS,
                        event_hooks={"response": [_check_redirect]})  # fmt: skip
