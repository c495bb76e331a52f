"""A synthesis request's one completion record, for the requests the core never dispatched.

Every synthesis request, on any transport, ends in exactly one completion log line and one count
in ``ttsvc_requests_total``: an exchange writes its own (``exchange.SynthesisExchange.finish``),
and a request refused before it reached a worker is written here, in the same fields, so a
dashboard sees refusals and failures alike.
"""

from __future__ import annotations

import time
import uuid

from ttsvc.gateway.core.caller import Caller
from ttsvc.gateway.core.state import GatewayState


def record_refusal(state: GatewayState, caller: Caller, body: dict[str, str], status: int) -> str:
    """Record ``caller``'s request, refused before dispatch with ``body``: its counters and its
    one completion line (once: a request already recorded is not recorded again); returns the
    uid the line carries."""
    if caller.recorded and caller.request_id is not None:
        return caller.request_id
    uid = uuid.uuid4().hex
    fields: dict[str, object] = {
        "uid": uid,
        **({} if caller.voice is None else {"voice": caller.voice}),
        "worker": None,  # refused before dispatch: no worker, queue, audio or engine
        "qsize": None,
        "text_len": caller.text_len,
        "ttfa_ms": None,
        "latency": round(1000 * (time.perf_counter() - caller.started), 1),
        "audio_s": 0.0,
        "rtf": None,
        "engine_version": None,
        "status": body["type"],
        "error_type": body["type"],
        **caller.log_labels(),
    }
    state.complete(fields, status)
    caller.recorded = True
    caller.request_id = uid
    return uid
