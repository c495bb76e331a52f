"""The HTTP routes: the page, health, voices, the synthesis APIs and OpenAI's models.

Each route only checks and resolves its request (key, voice, format, speaker) into a
``SpeechOrder`` and hands it to the HTTP answer of a synthesis (``http.speech``); the timestamped
route and ElevenLabs' text-to-speech routes add themselves from their own modules. ``add_routes``
adds them all to the app in the order they match, behind the API key where one is required.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import Depends, FastAPI, Request, params
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from ttsvc.audio.encode import FORMATS
from ttsvc.errors import FormatUnavailable, InvalidParameter, UnknownModel
from ttsvc.gateway.core.order import SpeechOrder, streamed
from ttsvc.gateway.core.state import GatewayState
from ttsvc.gateway.http.bodies import SynthesizeRequest
from ttsvc.gateway.http.caller import http_caller
from ttsvc.gateway.http.elevenlabs import add_elevenlabs_routes
from ttsvc.gateway.http.openai import (
    OPENAI_MODELS,
    OPENAI_RATE,
    SpeechRequest,
    model_card,
)
from ttsvc.gateway.http.speech import synthesis_response
from ttsvc.gateway.http.sse import SpeechEventBody
from ttsvc.gateway.http.timestamps import add_timestamps_route
from ttsvc.lifecycle.swapper import EngineSwapper
from ttsvc.protocol import EngineSpec
from ttsvc.repository.watcher import Rejection
from ttsvc.text.ssml import is_ssml
from ttsvc.voice import describe

STATIC = Path(__file__).with_name("static")
"""The try-it page's files (package data): served by the service itself, no CDN."""
PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "media-src 'self' blob:; img-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
"""The page talks to its own origin only; its audio element plays blobs the page made."""


def add_routes(app: FastAPI, state: GatewayState) -> None:
    """Add every route to ``app``: all but the page, its files, /live and /health take the key
    (where keys are on); the documentation routes only with ``api_docs`` on."""

    async def authenticate(request: Request) -> None:
        """Every route but /health and /live: the key's name is kept for logs, never the key."""
        if state.keys is not None:
            http_caller(request).key = state.keys.authenticate(request.headers.get("authorization"))

    async def authenticate_xi(request: Request) -> None:
        """ElevenLabs' clients send the key as ``xi-api-key`` (``GET /v1/voices``, its
        text-to-speech routes)."""
        if state.keys is not None:
            xi_key = request.headers.get("xi-api-key")
            header = f"Bearer {xi_key}" if xi_key else request.headers.get("authorization")
            http_caller(request).key = state.keys.authenticate(header)

    guarded = [Depends(authenticate)]
    xi_guarded = [Depends(authenticate_xi)]

    if state.settings.api_docs:
        _add_docs(app, guarded)
    _add_public(app, state)
    _add_voices(app, state, guarded, xi_guarded)
    _add_speech(app, state, guarded)
    add_elevenlabs_routes(app, state, xi_guarded)


def _add_docs(app: FastAPI, guarded: list[params.Depends]) -> None:
    """FastAPI's own documentation routes take no dependencies: these are the same pages
    behind the key (a browser cannot send one, so with keys on they serve curl and tools)."""

    @app.get("/openapi.json", dependencies=guarded, include_in_schema=False)
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", dependencies=guarded, include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="ttsvc")

    @app.get("/redoc", dependencies=guarded, include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url="/openapi.json", title="ttsvc")


def _add_public(app: FastAPI, state: GatewayState) -> None:
    """The routes without a key: the try-it page and its files, liveness and readiness."""

    # the page is static and holds no secret: public even with keys on (it asks for the key and
    # sends it with its own requests)
    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8",
                            headers={"Content-Security-Policy": PAGE_POLICY,
                                     "X-Content-Type-Options": "nosniff"})  # fmt: skip

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/live")
    async def live() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/health")
    async def health() -> JSONResponse:
        pool, balancer = state.pool, state.balancer
        if state.draining:
            return JSONResponse({"status": "draining", "score": 0.0}, status_code=503)
        if state.catalog is not None and not state.catalog.serving():
            # nothing verified to serve: GET /voices says which versions were refused and why
            return JSONResponse({"status": "no_verified_engine", "score": 0.0}, status_code=503)
        if pool is None or balancer is None or not balancer.live_workers():
            return JSONResponse({"status": "no_ready_worker", "score": 0.0}, status_code=503)
        # the score is the real-time headroom left (0-1): a pod at 0 refuses new streams;
        # the voices that answer at once, as GET /voices marks them "serving"
        return JSONResponse(
            {"status": "ok", "score": round(balancer.headroom(), 3), "inflight": state.inflight,
             "voices": state.ready_voices()}
        )


def _add_voices(app: FastAPI, state: GatewayState, guarded: list[params.Depends],
                xi_guarded: list[params.Depends]) -> None:  # fmt: skip
    """``GET /voices``, and ``GET /v1/voices`` (ElevenLabs' shape, its key header taken too)."""
    async def details(spec: EngineSpec | None) -> dict[str, object]:
        return {} if spec is None else describe(await state.voice_config(spec))

    def voice_entry(name: str, swapper: EngineSwapper, details: dict[str, object],
                    aliases: list[str]) -> dict[str, object]:  # fmt: skip
        serving, loaded_on = state.pool.serving(name) if state.pool else ([], [])
        current = swapper.current

        def listed(found: dict[int, Rejection]) -> list[dict[str, object]]:
            return [r.public() for _, r in sorted(found.items(), reverse=True)]

        engines = {
            "current": current.label if current else None,
            "reloads": dict(swapper.reloads),
            "last_error": swapper.last_error,
            # versions present that may not serve, newest first: version, file name, reason
            "rejected": listed(swapper.rejected),
            # versions with a file still changing (a copy in progress), judged once it settles
            "pending": listed(swapper.pending),
        }
        return {"name": name, **details, "default": name == state.voice, "aliases": aliases,
                "state": state.voice_state(name),
                "engine_versions": serving,
                # workers holding it loaded now; the others load it when a request needs it
                "loaded_on": loaded_on,
                "engines": engines}  # fmt: skip

    @app.get("/lexicons", dependencies=guarded)
    async def lexicons() -> dict[str, object]:
        """The pronunciation lexicons loaded (by name, with language and lexeme count) and the
        files refused (with line and reason)."""
        store = state.lexicons
        return {"lexicons": [], "refused": []} if store is None else dict(store.describe())

    @app.get("/voices", dependencies=guarded)
    async def voices() -> dict[str, object]:
        catalog = state.catalog
        if catalog is None:
            return {"voices": []}
        names = sorted(catalog.swappers, key=lambda n: (n != state.voice, n))
        aliases: dict[str, list[str]] = {}
        for alias, target in state.aliases.items():
            aliases.setdefault(target, []).append(alias)
        entries = []
        for name in names:
            swapper = catalog.swappers[name]
            if name != state.voice and not (swapper.present or swapper.current):
                continue  # no version at all yet (a compile in progress, lost+found)
            entries.append(voice_entry(name, swapper, await details(swapper.current),
                                       sorted(aliases.get(name, []))))  # fmt: skip
        return {"voices": entries}

    @app.get("/v1/voices", dependencies=xi_guarded)
    async def elevenlabs_voices() -> dict[str, object]:
        """The served voices in ElevenLabs' shape, for clients of its streaming WebSockets
        (``ws.elevenlabs``) that list voices: a voice's ``voice_id`` is its name."""
        catalog = state.catalog
        if catalog is None:
            return {"voices": []}
        served = [n for n, s in catalog.swappers.items() if s.current is not None]
        entries = []
        for name in sorted(served, key=lambda n: (n != state.voice, n)):
            info = await details(catalog.swappers[name].current)
            language = info.get("language")
            found = {"language": language.get("code") if isinstance(language, dict) else None,
                     "quality": info.get("quality")}  # fmt: skip
            labels = {k: v for k, v in found.items() if isinstance(v, str)}
            entries.append({"voice_id": name, "name": name, "category": "premade",
                            "labels": labels, "description": None, "preview_url": None,
                            "settings": None})  # fmt: skip
        return {"voices": entries}



def _add_speech(
    app: FastAPI, state: GatewayState, guarded: list[params.Depends]
) -> None:
    """The synthesis APIs, in this order: ``/synthesize``, OpenAI's speech, the timestamped
    route and OpenAI's models (the WebSocket is its own transport, added by the app)."""

    @app.post("/synthesize", dependencies=guarded)
    async def synthesize(body: SynthesizeRequest, request: Request) -> Response:
        http_caller(request).labels["format"] = body.format
        voice = await state.resolve_voice(body.voice, http_caller(request))
        fmt = FORMATS[body.format]
        order = SpeechOrder.from_settings(body, text=body.text, voice=voice,
                                          speaker=await state.speaker_of(voice, body.speaker),
                                          format=fmt,
                                          stream=streamed(fmt, body.stream), api="synthesize")
        return await synthesis_response(state, order, request)

    @app.post("/v1/audio/speech", dependencies=guarded)
    async def speech(body: SpeechRequest, request: Request) -> Response:
        caller = http_caller(request)
        caller.labels.update(format=body.response_format, stream_format=body.stream_format)
        if body.model not in OPENAI_MODELS:
            raise UnknownModel(f"unknown model {body.model!r}: GET /v1/models lists them",
                               field="model")  # fmt: skip
        if body.response_format == "aac":
            raise FormatUnavailable("aac is not available (no AAC encoder here): use mp3, opus, "
                                    "flac, wav or pcm", field="response_format")  # fmt: skip
        if body.timestamps and body.stream_format != "sse":
            raise InvalidParameter("timestamps travel in speech events: set stream_format "
                                   '"sse" (or use /synthesize/with-timestamps)',
                                   field="timestamps")  # fmt: skip
        # the checks that need no voice come first: a bad request is not held in a voice wait
        voice = await state.resolve_voice(
            body.voice if isinstance(body.voice, str) else body.voice.id, caller
        )
        fmt = FORMATS[body.response_format]
        if body.timestamps:
            state.require_durations(voice)
        order = SpeechOrder(text=body.input, voice=voice, format=fmt,
                            stream=streamed(fmt, body.stream), api="openai", speed=body.speed,
                            sample_rate=OPENAI_RATE, timestamps=body.timestamps,
                            ssml=state.settings.openai_ssml and is_ssml(body.input),
                            empty_text=body.empty_text)  # fmt: skip
        if body.stream_format == "sse":
            events = SpeechEventBody(len(body.input), state.frames_per_s(voice), body.timestamps)
            return await synthesis_response(state, order, request, events)
        return await synthesis_response(state, order, request)

    add_timestamps_route(app, state, guarded)

    @app.get("/v1/models", dependencies=guarded)
    async def models() -> dict[str, object]:
        return {"object": "list", "data": [model_card(m) for m in OPENAI_MODELS]}

    @app.get("/v1/models/{model_id}", dependencies=guarded)
    async def model(model_id: str) -> dict[str, object]:
        if model_id not in OPENAI_MODELS:
            raise UnknownModel(f"unknown model {model_id!r}", field="model")
        return model_card(model_id)
