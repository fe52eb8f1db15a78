"""Small helpers the test suites share (importable functions, not fixtures)."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def wait_until(cond: Callable[[], bool], timeout: float, what: str, every: float = 0.01) -> None:
    """Poll ``cond`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


def one_line_refusal(r: subprocess.CompletedProcess[str], *needles: str) -> None:
    """A user mistake's answer: non-zero exit, one line on stderr holding every needle,
    never a traceback."""
    assert r.returncode != 0, r.stdout
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    for needle in needles:
        assert needle in r.stderr, r.stderr


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        server = self.server
        assert isinstance(server, HelloServer)
        server.hits += 1
        body = f"hello from {server.server_address[1]}\n".encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a: Any) -> None:
        pass


class HelloServer(ThreadingHTTPServer):
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
