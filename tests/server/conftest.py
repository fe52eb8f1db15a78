"""Real ``corral serve`` processes on 127.0.0.1 for the HTTP tests.

Servers run as ``python -m corral.server --port 0`` subprocesses of this checkout (the same
code ``corral serve`` runs); each prints ``corral: serving on <url>`` once it accepts
connections. Every server is stopped (SIGTERM, then SIGKILL) when its test ends.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest


SRC = Path(__file__).resolve().parents[2] / "src"
TOKEN = "test-token-0123456789abcdef"


def ticker(lines: int, every: float = 0.05, prefix: str = "tick") -> list[str]:
    """A command printing ``<prefix> i`` lines, ``every`` seconds apart."""
    return ["sh", "-c", f"i=0; while [ $i -lt {lines} ]; do echo {prefix} $i; i=$((i+1)); "
            f"sleep {every}; done"]


def ticker_text(lines: int, prefix: str = "tick") -> str:
    return "".join(f"{prefix} {i}\n" for i in range(lines))


class Server:
    """One running server process."""

    def __init__(self, proc: subprocess.Popen[str], url: str, home: Path, token: str | None,
                 log: list[str]) -> None:
        self.proc = proc
        self.url = url
        self.home = home
        self.token = token
        self.log = log
        self.ready = threading.Event()

    def wait_ready(self, timeout: float) -> bool:
        """Whether the server accepts connections within ``timeout`` seconds (``False``
        when it exited first)."""
        return self.ready.wait(timeout) and bool(self.url)

    @property
    def headers(self) -> dict[str, str]:
        """What a program sends: the token, and the header that marks a request no web page
        sent cross-site (a bodiless POST such as cancel needs it without a token)."""
        auth = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return {**auth, "X-Corral-Request": "1"}

    def client(self, **kw: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=30, **kw)

    def start(self, command: list[str], thread_id: str = "t", **body: Any) -> dict[str, Any]:
        with self.client() as c:
            r = c.post("/v1/runs", json={"thread_id": thread_id, "command": command, **body})
        assert r.status_code == 201, r.text
        data: dict[str, Any] = r.json()
        return data

    def run(self, run_id: str) -> dict[str, Any]:
        with self.client() as c:
            r = c.get(f"/v1/runs/{run_id}")
        assert r.status_code == 200, r.text
        data: dict[str, Any] = r.json()
        return data

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class Home:
    """A ``CORRAL_HOME`` (and so a SQLite store) that servers and CLI calls share."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.db = path / "corral.db"
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = str(SRC) + os.pathsep + self.env.get("PYTHONPATH", "")
        self.env["CORRAL_HOME"] = str(path)
        self.env["CORRAL_LEASE_TTL"] = "3"
        self.env.pop("CORRAL_API_TOKEN", None)
        self.env.pop("CORRAL_STORE", None)
        self.env.pop("CORRAL_SECRET", None)

    def log(self, run_id: str) -> list[dict[str, Any]]:
        """The run's stored events, checked gap-free."""
        with sqlite3.connect(self.db) as conn:
            rows = conn.execute(
                "SELECT offset, event FROM events WHERE run_id = ? ORDER BY offset", (run_id,)
            ).fetchall()
        assert [r[0] for r in rows] == list(range(1, len(rows) + 1)), "offsets must be gap-free"
        return [json.loads(r[1]) for r in rows]

    def raw(self, run_id: str) -> dict[str, Any]:
        with sqlite3.connect(self.db) as conn:
            (doc,) = conn.execute("SELECT doc FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        data: dict[str, Any] = json.loads(doc)
        return data

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "corral", *args], env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def spawn(self, *args: str, token: str | None = None, reaper: bool = False,
              extra_env: dict[str, str] | None = None, wait: bool = True) -> Server:
        """Start a server process; with ``wait``, once it accepts connections (else
        :meth:`Server.wait_ready` says when). The caller stops it."""
        env = dict(self.env)
        if token:
            env["CORRAL_API_TOKEN"] = token
        env.update(extra_env or {})
        argv = [sys.executable, "-m", "corral.server", "--port", "0", "--log-level", "info",
                *([] if reaper else ["--no-reaper"]), *args]
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        server = Server(proc, "", self.path, token, [])

        def drain() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                server.log.append(line)
                if line.startswith("corral: serving on "):
                    server.url = line.split()[3]
                    server.ready.set()
            server.ready.set()

        threading.Thread(target=drain, daemon=True).start()
        if wait and not server.wait_ready(60):
            server.stop(signal.SIGKILL)
            raise AssertionError("server did not start:\n" + "".join(server.log))
        return server

    @contextmanager
    def server(self, *args: str, token: str | None = None, reaper: bool = False,
               extra_env: dict[str, str] | None = None) -> Iterator[Server]:
        server = self.spawn(*args, token=token, reaper=reaper, extra_env=extra_env)
        try:
            yield server
        finally:
            server.stop()


@contextmanager
def uvicorn_server(target: str, env: dict[str, str], prefix: str, token: str | None,
                   app_dir: Path | None = None) -> Iterator[Server]:
    """An ASGI app (``module:attribute``) under uvicorn on 127.0.0.1, once it started;
    ``url`` is its address plus ``prefix`` (where corral is mounted)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    argv = [sys.executable, "-m", "uvicorn", target, "--fd", str(sock.fileno()),
            "--log-level", "info", *(["--app-dir", str(app_dir)] if app_dir else [])]
    proc = subprocess.Popen(argv, env=env, pass_fds=[sock.fileno()], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            cwd=SRC.parent)
    sock.close()
    server = Server(proc, f"http://127.0.0.1:{port}{prefix}", Path(env["CORRAL_HOME"]), token,
                    [])

    def drain() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            server.log.append(line)
            if "Application startup complete" in line:
                server.ready.set()
        server.ready.set()

    threading.Thread(target=drain, daemon=True).start()
    try:
        assert server.wait_ready(60) and proc.poll() is None, "".join(server.log)
        yield server
    finally:
        server.stop()


@pytest.fixture
def home(tmp_path: Path, need_bwrap_runs: None) -> Home:
    path = tmp_path / "corral-home"
    path.mkdir()
    return Home(path)


def sse_events(lines: Iterator[str], limit: int | None = None,
               on_comment: Callable[[str], None] | None = None
               ) -> Iterator[tuple[str | None, str | None, str]]:
    """Parse an event stream into ``(event name, id, data)`` tuples; the ``: end`` comment
    comes out as a last ``("end", None, "")``."""
    name: str | None = None
    ident: str | None = None
    data: list[str] = []
    count = 0
    for line in lines:
        if line == "":
            if data or name:
                yield name, ident, "\n".join(data)
                count += 1
                if limit is not None and count >= limit:
                    return
            name, ident, data = None, None, []
            continue
        if line.startswith(":"):
            if on_comment is not None:
                on_comment(line)
            if line == ": end":  # the server's end of a closed log (a comment: see _sse.py)
                yield "end", None, ""
                return
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            name = value
        elif field == "id":
            ident = value
        elif field == "data":
            data.append(value)


def read_stream(server: Server, run_id: str, *, after: int | None = None,
                last_event_id: int | None = None, limit: int | None = None,
                timeout: float = 60) -> tuple[list[tuple[int, dict[str, Any]]], bool]:
    """Read a run's event stream: ``([(offset, event)], saw_end)``; stops after ``limit``
    events (then disconnects) or at the end of the stream."""
    headers = dict(server.headers)
    if last_event_id is not None:
        headers["Last-Event-ID"] = str(last_event_id)
    params = {} if after is None else {"after": str(after)}
    got: list[tuple[int, dict[str, Any]]] = []
    ended = False
    with httpx.Client(base_url=server.url, timeout=timeout) as c, c.stream(
        "GET", f"/v1/runs/{run_id}/events", headers=headers, params=params
    ) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for name, ident, data in sse_events(r.iter_lines()):
            if name == "end":
                ended = True
                break
            assert ident is not None
            got.append((int(ident), json.loads(data)))
            if limit is not None and len(got) >= limit:
                break
    return got, ended
