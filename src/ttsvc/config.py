"""Settings: one pydantic-settings class, built once by the CLI and passed down, never global.

Every field is also a ``TTSVC_*`` environment variable (e.g. ``TTSVC_ENGINES_DIR``); command-line
flags override the environment. Validators refuse values that would make the service unsafe or
useless instead of letting them fail later inside a worker.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from ttsvc.synthesis import WindowSchedule

DEFAULT_VOICE = "en_US-joe-medium"


class Settings(BaseSettings):
    """Runtime settings shared by ``ttsvc synth`` and ``ttsvc serve``."""

    model_config = SettingsConfigDict(env_prefix="TTSVC_", extra="ignore")

    engines_dir: Path = Path("engines")
    """Root of the engine repository (a HostPath in Kubernetes)."""
    voice: str = DEFAULT_VOICE
    """Voice used when a request names none."""
    threads: int = Field(1, ge=1, le=64)
    """ONNX Runtime intra-op threads per worker process."""
    first_window_frames: int = Field(8, ge=1, le=256)
    """Frames in a sentence's first vocoder window: smaller starts audio sooner."""
    window_growth: float = Field(2.0, ge=1.0, le=8.0)
    """Growth factor of later windows."""
    max_window_frames: int = Field(128, ge=1, le=4096)
    """Largest vocoder window in frames."""
    max_sentence_chars: int = Field(200, ge=20, le=2000)
    """Sentences longer than this are split at clauses for streaming."""
    max_text_chars: int = Field(4096, ge=1, le=100_000)
    """Longest text accepted per request."""
    host: str = "0.0.0.0"  # a container: listen on every interface
    """Address ``ttsvc serve`` listens on."""
    port: int = Field(9000, ge=1, le=65535)
    workers: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1, le=256)
    """Worker processes (default: one per CPU)."""
    multiplex: bool = True
    """Interleave streams window by window in a worker (off: one whole request at a time)."""
    max_streams_per_worker: int = Field(8, ge=1, le=1024)
    """Streams admitted per worker; beyond, 429 with Retry-After."""
    queue_timeout_s: float = Field(10.0, gt=0, le=600)
    """A request that gets no first audio within this is failed (503) and cancelled."""
    max_body_bytes: int = Field(65536, ge=1024, le=16 * 1024 * 1024)
    """Request bodies over this get 413."""
    drain_grace_s: float = Field(30.0, ge=0, le=3600)
    """On SIGTERM, how long in-flight streams get to finish."""
    compile_default_voice: bool = True
    """Compile the packaged default voice when the engines directory has none."""
    log_level: str = "info"

    @model_validator(mode="after")
    def _windows_consistent(self) -> Settings:
        if self.max_window_frames < self.first_window_frames:
            raise ValueError("max_window_frames must be at least first_window_frames")
        return self

    def schedule(self) -> WindowSchedule:
        """The vocoder window schedule these settings describe."""
        return WindowSchedule(self.first_window_frames, self.window_growth, self.max_window_frames)
