"""In-sandbox entry point: loopback TCP → unix-socket forwarders, then the agent CLI.

Run inside the sandbox as ``python3 -c <this file's source> <config json> -- <argv...>``
(stdlib only, no corral import: the sandbox has the system Python, not corral). The config::

    {"forward": [{"name": "model", "port": 41000, "unix": "/run/corral/model.sock"},
                 {"name": "tools", "port": 0, "unix": "/run/corral/t.sock", "await": true}],
     "connect_patience": 10}

For each forward it listens on ``127.0.0.1:<port>`` (``0`` = any free port) and pipes
every accepted connection to a new connection to the unix socket (bound into the sandbox
from the host, where the model or egress proxy serves; a socket that is missing or refuses
is retried for ``connect_patience`` seconds, so the host side may start late or restart;
an ``await`` socket is waited for, as long, before the agent starts). With ``"announce":
true`` the entry first writes ``{"corral.ports": {name: port}}`` as one line to stdout (the
ACP bridge reads the agent's stdout and must know the tools port for ``mcpServers``). ``{corral.port.<name>}`` in the
agent's argv and environment is replaced by the port actually bound, ``{corral.home}`` by
``$HOME`` (a file corral wrote into the agent's home, named in argv). Then it runs the
agent as a child with inherited stdin/stdout/stderr (stdout is the journal: this script
never writes to it, but for the ``announce`` line), forwards SIGTERM/SIGINT/SIGHUP to the child's process group, and
exits with the child's status (``128 + N`` for a death by signal ``N``). (A run's timeout
is not enforced here, where the agent could stop it, but by the supervisor on the host.)

Nothing here is secret: credentials are added on the host side of the sockets.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs a fresh interpreter ~5 ms before the agent starts
    from typing import Any

BUF = 65536


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(BUF)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _connect(unix_path: str, patience: float) -> socket.socket:
    """Connect to the host service, waiting up to ``patience`` seconds for it to (re)appear
    (it may still be starting, or be restarted by a host taking the run over)."""
    deadline = time.monotonic() + patience
    delay = 0.01
    while True:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(unix_path)
            return upstream
        except (FileNotFoundError, ConnectionRefusedError):
            upstream.close()
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
        except OSError:
            upstream.close()
            raise


def _serve_conn(client: socket.socket, unix_path: str, patience: float) -> None:
    try:
        upstream = _connect(unix_path, patience)
    except OSError as exc:
        sys.stderr.write(f"corral: cannot reach {unix_path}: {exc}\n")
        client.close()
        return
    t = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    t.start()
    _pump(client, upstream)
    t.join()
    client.close()
    upstream.close()


def _accept_loop(listener: socket.socket, unix_path: str, patience: float) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_serve_conn, args=(client, unix_path, patience),
                         daemon=True).start()


def _substitute(value: str, ports: dict[str, int]) -> str:
    for name, port in ports.items():
        value = value.replace("{corral.port." + name + "}", str(port))
    if "{corral.home}" in value:
        value = value.replace("{corral.home}", os.environ.get("HOME", ""))
    return value


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write("usage: sandbox_entry CONFIG_JSON -- ARGV...\n")
        return 2
    config = json.loads(argv[1])
    command = argv[3:]
    ports: dict[str, int] = {}
    for fw in config.get("forward", []):
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", int(fw.get("port", 0))))
        listener.listen(128)
        ports[fw["name"]] = listener.getsockname()[1]
        patience = float(config.get("connect_patience", 10))
        threading.Thread(target=_accept_loop, args=(listener, fw["unix"], patience),
                         daemon=True).start()
    # A service the agent lists at start-up (an MCP server: some CLIs list its tools once
    # and go on without them when the first try fails) is waited for before the agent starts.
    for fw in config.get("forward", []):
        if fw.get("await"):
            try:
                _connect(fw["unix"], float(config.get("connect_patience", 10))).close()
            except OSError:
                pass  # no host serves it yet: the agent starts anyway, its calls fail
    if config.get("announce"):
        sys.stdout.write(json.dumps({"corral.ports": ports}) + "\n")
        sys.stdout.flush()
    env = {k: _substitute(v, ports) for k, v in os.environ.items()}
    command = [_substitute(a, ports) for a in command]
    child: subprocess.Popen[bytes] | None = None
    pending: list[int] = []

    def forward(signum: int, _frame: Any) -> None:
        if child is None:
            pending.append(signum)  # arrived before the child exists: deliver it after
            return
        try:
            os.killpg(child.pid, signum)
        except OSError:
            pass

    # Installed before the child starts, so no signal sent to us is ever lost.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    try:
        child = subprocess.Popen(command, env=env, start_new_session=True)
    except OSError as exc:
        sys.stderr.write(f"corral: cannot start {command[0]}: {exc}\n")
        return 127 if isinstance(exc, FileNotFoundError) else 126
    for signum in pending:
        forward(signum, None)
    rc = child.wait()
    # Tool processes the CLI left behind must not outlive it (and write to the journal).
    forward(signal.SIGKILL, None)
    sys.stdout.flush()
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    code = main(sys.argv)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    # Without the interpreter's teardown (the forwarders' threads, the modules), which the
    # run's end would wait for: nothing is left to write.
    os._exit(code)
