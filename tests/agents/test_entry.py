"""The in-sandbox entry (forwarders + child), run with the system Python on the
host exactly as it runs in a sandbox."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.harness._cli_base import entry_argv
from corral.testing import wait_until

PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(argv, capture_output=True, timeout=30, check=False, **kw)  # type: ignore[call-overload, no-any-return]


def test_exit_status_passes_through_and_stdout_is_the_childs_alone() -> None:
    r = run(entry_argv(PY, ["sh", "-c", "echo out; echo err >&2; exit 3"], forward=[]))
    assert (r.returncode, r.stdout, r.stderr) == (3, b"out\n", b"err\n")


def test_death_by_signal_is_128_plus_n() -> None:
    r = run(entry_argv(PY, ["sh", "-c", "kill -TERM $$"], forward=[]))
    assert r.returncode == 128 + signal.SIGTERM


def test_missing_program_is_127() -> None:
    r = run(entry_argv(PY, ["/nonexistent/agent"], forward=[]))
    assert r.returncode == 127 and b"cannot start /nonexistent/agent" in r.stderr


def test_sigterm_is_forwarded_to_the_child() -> None:
    child = "trap 'echo got-term; exit 7' TERM; echo ready; while :; do sleep 0.05; done"
    proc = subprocess.Popen(entry_argv(PY, ["sh", "-c", child], forward=[]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=15)
    assert proc.returncode == 7 and b"got-term" in out


@pytest.fixture
def echo_unix() -> Iterator[str]:
    path = f"/tmp/cent-{os.getpid()}.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(8)

    def loop() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                data = b""
                while not data.endswith(b"\n"):
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                conn.sendall(b"echo:" + data)

    threading.Thread(target=loop, daemon=True).start()
    yield path
    srv.close()
    os.unlink(path)


def test_forwarder_pipes_tcp_to_the_unix_socket_and_ports_are_substituted(
        echo_unix: str) -> None:
    client = (
        "import os, socket, sys\n"
        "port = int(sys.argv[1])\n"
        "assert os.environ['VIA'] == f'http://127.0.0.1:{port}'\n"
        "s = socket.create_connection(('127.0.0.1', port))\n"
        "s.sendall(b'ping\\n'); print(s.recv(100).decode(), end='')\n"
    )
    argv = entry_argv(PY, [PY, "-c", client, "{corral.port.m}"],
                      forward=[{"name": "m", "port": 0, "unix": echo_unix}])
    r = run(argv, env={"VIA": "http://127.0.0.1:{corral.port.m}", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"echo:ping\n"


def test_forwarder_waits_for_a_late_host_service(tmp_path: Path) -> None:
    path = f"/tmp/clate-{os.getpid()}.sock"
    marker = tmp_path / "connected"
    client = (
        "import pathlib, socket, sys\n"
        "s = socket.create_connection(('127.0.0.1', int(sys.argv[1])))\n"
        "pathlib.Path(sys.argv[2]).touch()\n"
        "s.sendall(b'late\\n'); print(s.recv(100).decode(), end='')\n"
    )
    proc = subprocess.Popen(entry_argv(PY, [PY, "-c", client, "{corral.port.m}", str(marker)],
                                       forward=[{"name": "m", "port": 0, "unix": path}]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    def connected() -> bool:
        assert proc.poll() is None, "the client exited before connecting"
        return marker.exists()

    wait_until(connected, "the client to connect (before the service exists)")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    try:
        srv.settimeout(10)
        conn, _ = srv.accept()
        with conn:
            conn.sendall(b"served:" + conn.recv(100))
        out, err = proc.communicate(timeout=15)
    finally:
        srv.close()
        os.unlink(path)
    assert proc.returncode == 0, err
    assert out == b"served:late\n"



def test_an_awaited_service_is_up_before_the_agent_starts(tmp_path: Path) -> None:
    # Codex lists an MCP server's tools once, when it starts: the agent must not start
    # before a driver serves them (a race that left Codex without corral's host tools).
    path = str(tmp_path / "tools.sock")
    proc = subprocess.Popen(
        entry_argv(PY, ["sh", "-c", "echo started"],
                   forward=[{"name": "tools", "port": 0, "unix": path, "await": True}]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.5)  # no service yet: the agent has not started
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(path)
        srv.listen(8)
        out, _ = proc.communicate(timeout=15)
        srv.close()
    finally:
        proc.kill()
    assert (proc.returncode, out) == (0, b"started\n")
