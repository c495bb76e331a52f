"""The "traditional" TTS server the seed article starts from: load the model for every request,
synthesize the whole text, answer one WAV.

Why this exists: it is the baseline the seed measured its gains against (first packet only when
everything is done, a model load in every request). It uses the same voice, the same text front
end as ttsvc (so the phonemes and audio are identical) and the unsplit Piper graph with ONNX
Runtime's defaults, as a straightforward implementation would. It is a benchmark fixture, not a
product: stdlib ``ThreadingHTTPServer``, a thread per connection, loopback only.

    python benchmarks/baselines/traditional_server.py --port 5001

``POST /synthesize`` takes ``{"text", "noise_scale"?, "noise_w"?, "length_scale"?}``;
``GET /health`` answers 200 once the voice files are found.
"""

from __future__ import annotations

import argparse
import io
import json
import wave
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import onnxruntime as ort

from ttsvc.compile.build import default_checkpoint
from ttsvc.errors import TTSError
from ttsvc.text.frontend import TextFrontEnd
from ttsvc.voice import VoiceConfig


class TraditionalSynthesizer:
    """Everything per request: a fresh ``InferenceSession`` of the whole voice graph each call."""

    def __init__(self) -> None:
        self.model, config = default_checkpoint()
        self.voice = VoiceConfig.load(config)
        self.front = TextFrontEnd(self.voice)

    def wav(self, text: str, noise: float, noise_w: float, length: float) -> bytes:
        """The whole utterance as one 16-bit mono WAV."""
        session = ort.InferenceSession(str(self.model), providers=["CPUExecutionProvider"])
        pieces = []
        scales = np.array([noise, length, noise_w], dtype=np.float32)
        for sentence in self.front.sentences(text):
            ids = np.array([sentence.ids], dtype=np.int64)
            lengths = np.array([ids.shape[1]], dtype=np.int64)
            audio = session.run(None, {"input": ids, "input_lengths": lengths, "scales": scales})
            pieces.append(np.asarray(audio[0]).reshape(-1))
        pcm = (np.clip(np.concatenate(pieces), -1.0, 1.0) * 32767).astype("<i2")
        buf = io.BytesIO()
        with wave.open(buf, "wb") as out:
            out.setnchannels(1)
            out.setsampwidth(2)
            out.setframerate(self.voice.sample_rate)
            out.writeframes(pcm.tobytes())
        return buf.getvalue()


def make_handler(synth: TraditionalSynthesizer) -> type[BaseHTTPRequestHandler]:
    """A request handler class bound to ``synth``."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            """Quiet: a log line per request would cost the baseline time it would not spend."""

        def _answer(self, code: int, body: bytes, kind: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._answer(200, b'{"status":"ok"}', "application/json")
            else:
                self._answer(404, b'{"error":"not found"}', "application/json")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
                wav = synth.wav(
                    str(body["text"]),
                    float(body.get("noise_scale", 0.667)),
                    float(body.get("noise_w", 0.8)),
                    float(body.get("length_scale", 1.0)),
                )
            except (KeyError, ValueError, TypeError, TTSError) as exc:
                self._answer(400, json.dumps({"error": str(exc)}).encode(), "application/json")
                return
            self._answer(200, wav, "audio/wav")

    return Handler


def main() -> None:
    """Serve on loopback until interrupted."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5001)
    args = p.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), make_handler(TraditionalSynthesizer()))
    server.daemon_threads = True
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
