"""A loopback HTTP server that records the JSON bodies POSTed to it (the
webhook plugin's endpoint in tests); it can answer 500 to the first few."""

from __future__ import annotations

import json
import queue
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Endpoint:
    def __init__(self, fail_first: int = 0) -> None:
        self.bodies: queue.Queue[dict[str, Any]] = queue.Queue()
        self.fail_first = fail_first
        self.requests = 0
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                endpoint.requests += 1
                if endpoint.requests <= endpoint.fail_first:
                    self.send_response(500)
                else:
                    endpoint.bodies.put(json.loads(body))
                    self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/events"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def next(self, timeout_s: float = 10.0) -> dict[str, Any]:
        return self.bodies.get(timeout=timeout_s)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
