"""Another local user attacks a live run's sockets (issue #25, defect 2).

As root, every run's model proxy, egress proxy and host-tools sockets sit under one shared
directory that `/proc/net/unix` lists to every user. Another user must get nothing out of
them: not a model call on the host's key (nor a token of the run's budget), not a
connection through the egress proxy, not a host tool. Each socket is reachable only by the
sandbox's own ids (and root), and each service asks for the run's own token before it
forwards anything; the sandbox itself still gets through (the control in each test).

The docker cases are in ``test_local_users_docker.py`` (run serially).
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from corral.net._model_proxy import PLACEHOLDER_KEY
from corral.providers._bubblewrap import BubblewrapProvider
from corral.stores._signal import NotifySignal
from corral.testing._model_server import ModelServer

from .local_users import (
    NOBODY,
    as_user,
    connect_request,
    from_sandbox,
    live_run,
    model_request,
    tool_calls,
    tools_request,
)

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root (setpriv to another "
                                                          "uid; the shared socket directory)")]


def test_another_user_cannot_spend_a_runs_model_key(bwrap: BubblewrapProvider,
                                                    model_server: ModelServer) -> None:
    async def go() -> None:
        async with live_run(bwrap, model_server) as run:
            sock = run.prepared.model_socket
            attack = await as_user(NOBODY, sock, model_request(PLACEHOLDER_KEY))
            # the socket is the sandbox's: another uid cannot even connect
            assert attack.get("errno") == errno.EACCES, attack
            assert model_server.requests == []
            usage = run.prepared.model_proxy.usage
            assert (usage.requests, usage.total) == (0, 0)
            # the sandbox itself gets through with its run's token
            ok = await from_sandbox(run.handle, run.inside(sock),
                                    model_request(run.prepared.proxy_token))
            assert ok["status"] == 200, ok
            assert len(model_server.requests) == 1

    anyio.run(go)


def test_a_client_without_the_runs_token_is_refused_and_not_counted(
        bwrap: BubblewrapProvider, model_server: ModelServer) -> None:
    """Whoever reaches the socket (here root, which the socket's mode does not stop) needs
    the run's token: without it, or with another run's, a 401 and nothing forwarded."""
    async def go() -> None:
        async with live_run(bwrap, model_server) as run:
            sock = run.prepared.model_socket
            for key in (PLACEHOLDER_KEY, "", run.prepared.proxy_token[:-1] + "x"):
                attack = await as_user(0, sock, model_request(key))
                assert attack["status"] == 401, attack
                assert "run" in attack["body"], attack
            assert model_server.requests == []
            usage = run.prepared.model_proxy.usage
            assert (usage.requests, usage.refused, usage.total) == (0, 0, 0)
            ok = await as_user(0, sock, model_request(run.prepared.proxy_token))
            assert ok["status"] == 200, ok
            # the proxy swapped the run's token for the real key upstream
            assert [r.api_key for r in model_server.requests] == [
                run.prepared.model_proxy.upstream.api_key]

    anyio.run(go)


def test_another_user_cannot_tunnel_through_a_runs_egress_proxy(
        bwrap: BubblewrapProvider, model_server: ModelServer) -> None:
    async def go() -> None:
        async with live_run(bwrap, model_server) as run:
            sock = run.prepared.egress_socket
            assert sock is not None
            target = f"127.0.0.1:{run.tcp_port}"
            attack = await as_user(NOBODY, sock, connect_request(target, None))
            assert attack.get("errno") == errno.EACCES, attack
            # reaching the socket is not enough: the run's token is asked first
            for token in (None, "not-the-token"):
                attack = await as_user(0, sock, connect_request(target, token))
                assert attack["status"] == 407, attack
            assert run.tcp_accepted == []
            ok = await from_sandbox(run.handle, run.inside(sock),
                                    connect_request(target, run.prepared.proxy_token))
            assert ok["status"] == 200, ok
            with anyio.fail_after(10):
                while not run.tcp_accepted:
                    await anyio.sleep(0.02)

    anyio.run(go)


def test_another_user_cannot_call_a_runs_host_tools(bwrap: BubblewrapProvider,
                                                   model_server: ModelServer) -> None:
    async def go() -> None:
        async with live_run(bwrap, model_server) as run:
            tools = run.prepared.host_tools
            assert tools is not None
            attack = await as_user(NOBODY, tools.socket, tools_request("guessed-token-0123456"))
            assert attack.get("errno") == errno.EACCES, attack
            attack = await as_user(0, tools.socket, tools_request(None))
            assert attack["status"] == 401, attack
            assert tool_calls == []
            ok = await from_sandbox(run.handle, run.inside(tools.socket),
                                    tools_request(tools.token))
            assert ok["status"] not in (401, 403), ok  # past the guard (MCP answers)

    anyio.run(go)


def test_a_runs_socket_directory_is_closed_to_other_users(bwrap: BubblewrapProvider,
                                                          model_server: ModelServer) -> None:
    """The directory itself: root and the sandbox's group may enter, nobody else may."""
    async def go() -> None:
        async with live_run(bwrap, model_server) as run:
            net_dir = run.prepared.model_socket.parent
            st = net_dir.stat()
            assert st.st_mode & 0o007 == 0, oct(st.st_mode)
            for sock in (run.prepared.model_socket, run.prepared.egress_socket):
                assert sock is not None
                assert sock.stat().st_mode & 0o007 == 0, (sock, oct(sock.stat().st_mode))

    anyio.run(go)


# ---------------------------------------------------------------- store wake-ups

SEND = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.sendto(b"!", "\0" + sys.argv[1])
"""


def _poke_as(uid: int | None, name: str) -> None:
    """Send one wake-up datagram to the abstract socket ``name``, as ``uid`` (``None``:
    this process's uid); returns once it is queued at the receiver."""
    prefix = [] if uid is None else ["setpriv", f"--reuid={uid}", f"--regid={uid}",
                                     "--clear-groups"]
    subprocess.run([*prefix, sys.executable if uid is None else "/usr/bin/python3", "-I",
                    "-S", "-c", SEND, name], check=True, timeout=30)


def _abstract_names() -> set[str]:
    """Abstract unix socket names as any user sees them in /proc/net/unix."""
    names = set()
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 8 and parts[7].startswith("@"):
            names.add(parts[7][1:])
    return names


def test_a_wakeup_datagram_from_another_user_is_ignored(tmp_path: Path) -> None:
    sig = NotifySignal(tmp_path / "notify")

    async def go() -> None:
        sig.listen()
        try:
            # what another user finds: the listener's name in /proc/net/unix
            name = next(n for n in _abstract_names() if n.startswith("corral-")
                        and (tmp_path / "notify" / n.removeprefix("corral-")).exists())
            seen = sig.generation
            await anyio.to_thread.run_sync(_poke_as, NOBODY, name)
            # the datagram is queued already: a wait that counted it would return at once
            await sig.wait(seen, 1.0)
            assert sig.generation == seen
            assert sig.ignored >= 1
            # the store's own user still wakes it
            await anyio.to_thread.run_sync(_poke_as, None, name)
            with anyio.fail_after(30):
                await sig.wait(seen, 30)
            assert sig.generation > seen
        finally:
            sig.close()

    anyio.run(go)
