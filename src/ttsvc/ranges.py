"""The ranges of what a request may ask of a voice, declared once.

Every API's request body (``gateway/core/order.py``, ``gateway/http/openai.py``) and the
synthesizer's own parameters (``synthesis/params.py``, built in the worker) validate the same
fields; with one declaration an API cannot accept a value the worker then refuses, and a range
changes in one place. Pydantic only (no numpy, no engines): the gateway imports it.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

# allow_inf_nan=False: JSON parsers here accept NaN and Infinity, which fail every bound, and
# the error must say what is wrong with them ("a finite number"), not name a bound they missed
SPEED_MIN, SPEED_MAX = 0.25, 4.0
"""OpenAI's speed range; SSML's ``prosody rate`` times a request's speed is kept inside it."""
Speed = Annotated[float, Field(ge=SPEED_MIN, le=SPEED_MAX, allow_inf_nan=False)]
"""Speaking rate: 2.0 is twice as fast (divides the voice's length scale)."""
Noise = Annotated[float, Field(ge=0.0, le=2.0, allow_inf_nan=False)]
"""Latent noise (``noise_scale``) or duration noise (``noise_w``); 0 is deterministic."""
Silence = Annotated[float, Field(ge=0.0, le=5.0, allow_inf_nan=False)]
"""Seconds of silence after each sentence but the last."""

SPEED = 1.0
SENTENCE_SILENCE = 0.2
