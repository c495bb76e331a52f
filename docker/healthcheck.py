"""The image's HEALTHCHECK: exit 0 while ``GET /health`` answers 200, else 1.

/health is readiness (a verified engine serves and the server is not draining), which is what
"healthy" should mean to Docker and Compose. Standard library only: the slim image has no curl.
"""

import os
import sys
import urllib.request

port = os.environ.get("TTSVC_PORT", "9000")
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=3) as response:
        sys.exit(0 if response.status == 200 else 1)
except OSError as exc:  # refused, timed out, or an HTTP error status such as 503 (draining)
    print(f"unhealthy: {exc}", file=sys.stderr)
    sys.exit(1)
