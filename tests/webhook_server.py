"""A real HTTP server, in a thread, that receives webhooks and answers from a script."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    path: str
    at: float  # monotonic
    body: bytes
    status: int

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class WebhookServer:
    port: int
    script: list[tuple[int, dict[str, str]]] = field(default_factory=list)  # answers, in order; then 200
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str = "/hooks/T000/B000/s3cr3t-token") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    @property
    def delivered(self) -> list[Received]:
        with self.lock:
            return [r for r in self.received if 200 <= r.status < 300]

    def wait_for(self, count: int, timeout: float = 30.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.delivered
            if len(got) >= count:
                return got
            time.sleep(0.05)
        raise AssertionError(f"expected {count} deliveries, got {len(self.delivered)}")


@contextmanager
def webhook_server(script: list[tuple[int, dict[str, str]]] | None = None) -> Iterator[WebhookServer]:
    state = WebhookServer(port=0, script=list(script or []))

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with state.lock:
                status, headers = state.script.pop(0) if state.script else (200, {})
                state.received.append(Received(self.path, time.monotonic(), body, status))
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
