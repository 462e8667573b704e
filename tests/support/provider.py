"""A small rate-limited, OpenAI-compatible provider for tests (a real HTTP server)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar


class FakeProvider(BaseHTTPRequestHandler):
    """Answers POST /v1/chat/completions. ``mode`` picks the behaviour:

    ok, 429-seconds, 429-ms, 429-date, 429-reset-tokens, 500, 400, limit-exhausted.
    """

    mode: ClassVar[str] = "ok"
    requests: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        FakeProvider.requests.append(body)
        mode = FakeProvider.mode
        headers: dict[str, str] = {"Content-Type": "application/json"}
        status: int = 200
        content = f"echo: {body['messages'][-1]['content']}"
        payload: dict[str, Any] = {
            "choices": [{"message": {"role": "assistant", "content": content}}]
        }
        if mode == "429-seconds":
            status, headers["Retry-After"] = 429, "2"
        elif mode == "429-ms":
            status, headers["retry-after-ms"] = 429, "1500"
        elif mode == "429-date":
            import time

            status = 429
            now = time.time()
            headers["Date"] = formatdate(now, usegmt=True)
            headers["Retry-After"] = formatdate(now + 3, usegmt=True)
        elif mode == "429-reset-tokens":
            status, headers["x-ratelimit-reset-tokens"] = 429, "1m30s"
        elif mode == "500":
            status = 500
        elif mode == "400":
            status = 400
        elif mode == "limit-exhausted":
            headers.update(
                {
                    "x-ratelimit-limit-requests": "60",
                    "x-ratelimit-remaining-requests": "0",
                    "x-ratelimit-reset-requests": "2s",
                }
            )
        if status != 200:
            payload = {"error": {"message": mode}}
        data = json.dumps(payload).encode()
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def provider(mode: str = "ok") -> Iterator[str]:
    FakeProvider.mode = mode
    FakeProvider.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeProvider)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
