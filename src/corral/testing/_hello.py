"""A loopback HTTP service for egress tests: answers ``hello from <port>`` and counts the
requests it got (stdlib only)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["LoopbackHello"]


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        server: Any = self.server
        server.hits += 1
        body = f"hello from {server.server_address[1]}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class LoopbackHello(ThreadingHTTPServer):
    """An HTTP service on ``host`` answering ``hello from <port>`` and counting requests
    (``hits``); serving once started, until :meth:`stop`."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        super().__init__((host, 0), _Hello)
        self.hits = 0
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
