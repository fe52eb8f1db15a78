"""A scripted model server for tests: Anthropic Messages, OpenAI Responses and Gemini
``generateContent``, streamed.

It runs on ``127.0.0.1`` (an ephemeral port) or a unix socket in a background thread, so
sync tests, async tests and benchmarks can all use it. Every request is recorded
(:attr:`ModelServer.requests`: method, path, headers with the API key, parsed body) and
answered by a *script*: a function of the :class:`ModelRequest` that returns a reply, or a
list of replies used in order.

Replies: :class:`Text` (a final answer), :class:`ToolCall` (ask the agent to run a shell
command), :class:`Fail` (an HTTP error in the protocol's error shape), :class:`Hang`
(never answer, optionally after part of a stream), and any reply can be slowed down with
``delay`` (seconds between SSE frames) and carry ``reasoning`` text.

The wire formats are exactly what the real CLIs were seen to accept (see the
``harness-cli-facts`` reference): ``event: <name>\\ndata: <json>\\n\\n`` frames sent with
``Connection: close`` and no content length. The stock script :func:`shell_then_text`
mirrors the stateless rule that works for every CLI: the last user turn carries a tool
result → final text, otherwise → call the shell tool.

What a script sees and answers is :mod:`corral.testing._model_script`'s; the frames each
protocol is answered with are :mod:`corral.testing._model_wire`'s.

Example::

    with ModelServer(shell_then_text("echo hi > out.txt", "done: {output}")) as srv:
        env = {"ANTHROPIC_BASE_URL": srv.url, "ANTHROPIC_API_KEY": "k"}
        ...
        assert srv.requests[0].api_key == "k"
"""

from __future__ import annotations

import json
import os
import socketserver
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

from corral.testing._polling import wait_until
from corral.testing._model_script import Fail, Hang, ModelRequest, Reply, Script, Text, ToolCall, shell_then_text
from corral.testing._model_wire import (
    anthropic_frames,
    error_body,
    gemini_frames,
    gemini_json,
    protocol_of,
    responses_frames,
)

__all__ = ["ModelServer"]


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_HEAD(self) -> None:
        self._handle()

    def _handle(self) -> None:
        req = self._answer(time.perf_counter())
        if not req.reply.startswith("hang"):
            req.answered = time.perf_counter()

    def _answer(self, arrived: float) -> ModelRequest:
        """Record and answer the request (which this returns)."""
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        req = ModelRequest(
            method=self.command,
            path=self.path,
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
            raw=raw,
            protocol=protocol_of(self.path),
            arrived=arrived,
        )
        owner = self.server.owner
        reply = owner._next_reply(req)
        owner._record(req)
        if req.protocol == "other" or reply is None:
            req.reply = "empty"
            self._send_json(200, {})
            return req
        if isinstance(reply, Fail):
            req.reply = f"fail {reply.status}"
            self._send_json(reply.status, error_body(req.protocol, reply))
            return req
        if isinstance(reply, Hang) and reply.after_frames == 0:
            req.reply = "hang"
            owner._stopping.wait()
            return req
        frames_of = {"anthropic": anthropic_frames,
                     "gemini": gemini_frames}.get(req.protocol, responses_frames)
        stall_after: int | None = None
        if isinstance(reply, Hang):
            stall_after = reply.after_frames
            inner: Text | ToolCall = reply.then or Text("partial answer")
            req.reply = f"hang after {stall_after} frames"
        else:
            inner = reply
            req.reply = "tool_call" if isinstance(reply, ToolCall) else "text"
        if req.protocol == "gemini" and ":streamGenerateContent" not in self.path:
            self._send_json(200, gemini_json(req, inner))
            return req
        wants_stream = not isinstance(body, dict) or body.get("stream", True)
        if not wants_stream:
            self._send_json(200, {"error": "the scripted model server only streams"})
            return req
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.send_header("request-id", f"req_corral{owner._count:04d}")
        self.end_headers()
        self.close_connection = True
        for i, chunk in enumerate(frames_of(inner, req, owner._count)):
            if stall_after is not None and i >= stall_after:
                owner._stopping.wait()
                return req
            if inner.delay:
                time.sleep(inner.delay)
            try:
                self.wfile.write(chunk)
                self.wfile.flush()
            except OSError:
                return req
        return req

    def _send_json(self, status: int, data: dict[str, Any]) -> None:
        payload = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.send_header("connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            self.wfile.write(payload)
        except OSError:
            pass


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    owner: ModelServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hangs up mid-stream is normal here


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    owner: ModelServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


class _UnixHandler(_Handler):
    def address_string(self) -> str:
        return "unix"

    def setup(self) -> None:
        super().setup()
        self.client_address = ("unix", 0)


class ModelServer:
    """A scripted model server (see the module docstring). Use as a context manager, or
    call :meth:`start` and :meth:`stop`.

    ``script``: a function ``ModelRequest -> Reply``, or a sequence of replies used in
    order (a request past the end gets a 500 "script exhausted"). Requests that are not
    model calls (``GET``s, unknown paths) get ``200 {}`` and are recorded too. ``unix``:
    serve on that unix socket path instead of ``127.0.0.1``.
    """

    def __init__(self, script: Script | None = None, *, unix: str | None = None) -> None:
        self.script: Script = script if script is not None else shell_then_text(
            "echo hi > out.txt && ls"
        )
        self.unix = unix
        self.requests: list[ModelRequest] = []
        self._lock = threading.Lock()
        self._count = 0
        self._stopping = threading.Event()
        self._server: _HTTPServer | _UnixHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle
    def start(self) -> Self:
        if self._server is not None:
            return self
        self._stopping.clear()
        if self.unix is not None:
            if os.path.exists(self.unix):
                os.unlink(self.unix)
            server: _HTTPServer | _UnixHTTPServer = _UnixHTTPServer(self.unix, _UnixHandler)
        else:
            server = _HTTPServer(("127.0.0.1", 0), _Handler)
        server.owner = self
        # A client that resets before accept() must not block the accept loop (and stop()).
        server.socket.settimeout(0.5)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="corral-model-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; releases hanging replies (their connections are closed)."""
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- addresses
    @property
    def port(self) -> int:
        if self._server is None or self.unix is not None:
            raise RuntimeError("the model server is not serving on TCP")
        addr = self._server.server_address
        assert isinstance(addr, tuple)
        return int(addr[1])

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` (the Anthropic base URL)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_url(self) -> str:
        """``http://127.0.0.1:<port>/v1`` (an OpenAI-style base URL)."""
        return f"{self.url}/v1"

    @property
    def gemini_url(self) -> str:
        """``http://127.0.0.1:<port>`` (a ``GOOGLE_GEMINI_BASE_URL``; requests keep their
        ``/v1beta/...`` path)."""
        return self.url

    # -- scripting
    def _next_reply(self, req: ModelRequest) -> Reply | None:
        if req.protocol == "other":
            return None
        with self._lock:
            self._count += 1
            n = self._count
        script = self.script
        if callable(script):
            return script(req)
        if n - 1 < len(script):
            return script[n - 1]
        return Fail(500, f"scripted model server: script exhausted after {n - 1} replies")

    def _record(self, req: ModelRequest) -> None:
        with self._lock:
            self.requests.append(req)

    @property
    def model_requests(self) -> list[ModelRequest]:
        """Recorded requests that were model calls (``/messages``, ``/responses`` or
        Gemini's ``:generateContent`` family)."""
        with self._lock:
            return [r for r in self.requests if r.protocol != "other"]

    def wait_for_requests(self, n: int, timeout: float = 10.0) -> list[ModelRequest]:
        """Block until at least ``n`` model calls were recorded (or raise
        :class:`~corral.testing.WaitTimeout`)."""
        wait_until(lambda: len(self.model_requests) >= n, f"{n} model requests",
                   timeout=timeout)
        return self.model_requests
