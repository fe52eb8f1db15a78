"""Attacks on the channel between corral and a docker sandbox's agent (#32).

Every command of a docker sandbox is a request to its agent over one ``docker exec``
stream (corral.providers._docker_agent): the agent's stdin and stdout are the channel.
Each test is an attack on it with the real agent and dockerd: the agent's uid (1000)
inside the container looking for a way to the agent (a socket, its pipes through
``/proc``, its memory, a signal), impersonating it (forged frames on every descriptor a
command has), a replayed conversation on a new stream, a flood of requests and garbage,
the command's secrets in an argv or the daemon's records, a command escaping its tree
(a new session, a cleared environment) to outlive a timeout, and killing the agent in the
middle of a command.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

from corral.providers._agent_client import AgentLost, frame, hello_answer
from corral.providers._docker import DockerHandle, DockerProvider, container_name
from corral.providers._docker_agent import (
    DockerStreamConnection,
    hello,
    launch_fields,
    loader_argv,
)
from corral.providers._process import Outcome
from corral.sandbox._contracts import ResourceLimits, SandboxSpec
from corral.testing import wait_until_async
from corral.testing._plugin import require

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("need_docker")]

PY = "/usr/bin/python3"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _sandbox(spec: SandboxSpec | None = None) -> tuple[DockerProvider, DockerHandle]:
    provider = DockerProvider()
    h = await provider.create(spec)
    assert (await h.process.exec(["true"])).ok  # the agent is up
    assert provider.command_path()[0] == "agent", provider.command_path()
    return provider, h


@pytest.fixture
async def sandbox(corral_home: Path) -> AsyncIterator[DockerHandle]:
    provider, h = await _sandbox()
    try:
        yield h
    finally:
        await provider.destroy(h.ref)


def processes(h: DockerHandle) -> list[tuple[int, int, str]]:
    """(host pid, host ppid, args) of every process in the container."""
    top = h._provider.api.top(h.container, ps_args="-eo pid,ppid,args")
    return [(int(p[0]), int(p[1]), p[2]) for p in top["Processes"]]


def agents(h: DockerHandle) -> list[int]:
    """The host pids of the container's agents (not their commands' inits)."""
    procs = processes(h)
    pids = {p for p, _pp, args in procs if args.startswith("corral-agent stdio")}
    return [p for p, pp, args in procs if p in pids and pp not in pids]


async def test_the_agents_uid_finds_no_way_to_the_agent(sandbox: DockerHandle) -> None:
    # From inside, as the agent's uid: every unix socket the container lists, and every
    # door of the agent's (and its commands' inits') processes: their stdio pipes through
    # /proc, their memory, a trace, a signal. None opens.
    probe = (
        "import os, socket, ctypes\n"
        "names = [l.split()[-1] for l in open('/proc/net/unix').read().splitlines()[1:]"
        " if len(l.split()) > 7]\n"
        "reached = 0\n"
        "for n in names:\n"
        "    s = socket.socket(socket.AF_UNIX)\n"
        "    try: s.connect(n.replace('@', '\\0', 1) if n.startswith('@') else n); reached += 1\n"
        "    except OSError: pass\n"
        "roots = [p for p in os.listdir('/proc') if p.isdigit() and\n"
        "         open(f'/proc/{p}/cmdline', 'rb').read().startswith(b'corral-agent\\0stdio')]\n"
        "opened = 0\n"
        "for p in roots:\n"
        "    for path, mode in ((f'/proc/{p}/fd/0', 'wb'), (f'/proc/{p}/fd/1', 'rb'),\n"
        "                       (f'/proc/{p}/fd/1', 'wb'), (f'/proc/{p}/mem', 'rb'),\n"
        "                       (f'/proc/{p}/environ', 'rb')):\n"
        "        try: open(path, mode, buffering=0); opened += 1\n"
        "        except OSError: pass\n"
        "    try: os.kill(int(p), 0); opened += 1\n"
        "    except OSError: pass\n"
        "    libc = ctypes.CDLL(None, use_errno=True)\n"
        "    if libc.ptrace(16, int(p), 0, 0) == 0: opened += 1\n"  # PTRACE_ATTACH
        "print(reached, len(roots), opened)\n"
    )
    proc = await sandbox.process.spawn(["sleep", "30"])  # one command's init is there too
    try:
        r = await sandbox.process.exec([PY, "-c", probe])
    finally:
        await proc.kill(signal.SIGKILL)
        await proc.wait()
        await proc.aclose()
    reached, roots, opened = map(int, r.stdout.split())
    assert r.ok and (reached, opened) == (0, 0), r
    assert roots >= 3, r  # the agent, and the inits of both commands


async def test_a_command_cannot_forge_its_status_on_the_channel(sandbox: DockerHandle) -> None:
    # The command writes an exit frame with status 0 (bare, and inside a docker stream
    # header) on every descriptor it has, then fails: corral reports its real status.
    forged = frame(1, b"x", struct.pack("<iB", 0, 1))
    docker = b"\1\0\0\0" + struct.pack(">I", len(forged)) + forged
    script = (
        "import os, sys\n"
        f"f = {forged!r}\n"
        f"d = {docker!r}\n"
        "for fd in map(int, os.listdir('/proc/self/fd')):\n"
        "    for data in (f, d):\n"
        "        try: os.write(fd, data)\n"
        "        except OSError: pass\n"
        "sys.exit(7)\n"
    )
    r = await sandbox.process.exec([PY, "-c", script])
    assert (r.exit_code, r.signal) == (7, None), r
    assert forged in r.stdout


async def _raw_agent(h: DockerHandle, key: bytes) -> socket.socket:
    """A new agent stream in ``h``'s container, its binary and ``key`` sent."""
    api = h._provider.api
    binary = Path(h._provider._find_agent() or "").read_bytes()

    def start() -> socket.socket:
        exec_id = api.exec_create(h.container, loader_argv(1000), stdin=True, stdout=True,
                                  stderr=True, user="0:0")["Id"]
        raw = api.exec_start(exec_id, socket=True)
        sock: socket.socket = raw._sock
        sock.sendall(hello(binary, key))
        return sock

    return await anyio.to_thread.run_sync(start)


def _read_stream(sock: socket.socket) -> bytes:
    """Stdout of a docker stream until it ends (the agent hangs up)."""
    sock.settimeout(30)
    raw = b""
    while chunk := sock.recv(65536):
        raw += chunk
    out, off = b"", 0
    while off + 8 <= len(raw):
        size = struct.unpack(">I", raw[off + 4:off + 8])[0]
        if raw[off] == 1:
            out += raw[off + 8:off + 8 + size]
        off += 8 + size
    return out


async def test_a_replayed_conversation_runs_nothing(sandbox: DockerHandle) -> None:
    # A captured conversation (a hello answer and a start request, byte for byte) sent to
    # a new agent: its nonce is new, the answer is wrong, it hangs up before reading the
    # request.
    marker = "/workspace/replayed"
    key = secrets.token_bytes(64)
    sock = await _raw_agent(sandbox, key)
    conn = await DockerStreamConnection.open(sock, key, what="test")
    assert conn._nonce is not None
    blob = launch_fields("/workspace", {"PATH": "/usr/bin:/bin"}, ["touch", marker])
    captured = frame(0, b"H", hello_answer(key, conn._nonce)) + frame(1, b"S", blob)
    conn.close()
    for _ in range(2):
        s = await _raw_agent(sandbox, key)  # even with the same key
        s.sendall(captured)
        got = await anyio.to_thread.run_sync(_read_stream, s)
        s.close()
        assert got[8:9] == b"n" and len(got) == 4 + 5 + 32, got  # only its nonce
    r = await sandbox.process.exec(["ls", "/workspace"])
    assert r.ok and b"replayed" not in r.stdout, r


async def test_a_one_time_token_opens_no_docker_agent(sandbox: DockerHandle) -> None:
    # Docker's agent reads the key alone (no token) and accepts no 'T' frame at all: not
    # the all-zero token its unset slot holds, nor any other; it hangs up before the
    # request. Only the HMAC hello opens it.
    marker = "/workspace/by-token"
    blob = launch_fields("/workspace", {"PATH": "/usr/bin:/bin"}, ["touch", marker])
    for token in (bytes(32), secrets.token_bytes(32)):
        s = await _raw_agent(sandbox, secrets.token_bytes(64))
        s.sendall(frame(0, b"T", token) + frame(1, b"S", blob))
        got = await anyio.to_thread.run_sync(_read_stream, s)
        s.close()
        assert got[8:9] == b"n" and len(got) == 4 + 5 + 32, got  # only its nonce
    r = await sandbox.process.exec(["ls", "/workspace"])
    assert r.ok and b"by-token" not in r.stdout, r


async def test_a_flood_of_requests_and_garbage_leaves_the_sandbox_serving(
    corral_home: Path,
) -> None:
    provider, h = await _sandbox(SandboxSpec(limits=ResourceLimits(pids=64)))
    try:
        conn = await h._agent()
        assert conn is not None
        blob = launch_fields("/", {"PATH": "/usr/bin:/bin"}, ["sleep", "30"])

        def finish(status: int | None, reported: bool) -> Outcome:
            return Outcome(0)

        # A fork bomb through the channel: the container's pids limit holds, every request
        # is answered (started, or refused), and the agent is the same process after.
        agent = agents(h)
        procs = [await conn.start(blob, finish, lambda: False) for _ in range(300)]
        with anyio.fail_after(120):
            await conn._until(lambda: all(p._cmd.started or p._cmd.error for p in procs))
            await conn._until(lambda: sum(p._cmd.error is not None or p._cmd.status is not None
                                          for p in procs) >= 300 - 64)
        assert len(processes(h)) <= 64
        for p in procs:
            await p.kill(signal.SIGKILL)
        with anyio.fail_after(120):
            await conn._until(lambda: all(p._cmd.error is not None or p._cmd.status is not None
                                          for p in procs))
        assert agents(h) == agent
        r = await h.process.exec(["sh", "-c", "echo still here"])
        assert r.ok and r.stdout == b"still here\n", r
        # Garbage on the stream (a frame longer than any): the agent hangs up; the next
        # command is served by a new one.
        await conn._send(struct.pack("<IIB", 0xFFFFFFF0, 1, ord("S")))
        with anyio.fail_after(60), pytest.raises(AgentLost):
            await conn._until(lambda: False)
        r = await h.process.exec(["sh", "-c", "echo new agent"])
        assert r.ok and r.stdout == b"new agent\n", r
        await wait_until_async(lambda: agents(h) != agent, "the old agent to end")
    finally:
        await provider.destroy(h.ref)


async def test_the_commands_environment_is_in_no_argv_and_no_daemon_record(
    sandbox: DockerHandle,
) -> None:
    secret = "s3cr3t-" + os.urandom(8).hex()
    proc = await sandbox.process.spawn(["sleep", "30"], env={"API_TOKEN": secret})
    try:
        await wait_until_async(lambda: any(a == "sleep 30" for _p, _pp, a in processes(sandbox)),
                               "the command to run")
        for pid, _ppid, _args in processes(sandbox):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                environ = Path(f"/proc/{pid}/environ").read_bytes()
            except OSError:
                continue
            assert secret.encode() not in cmdline, pid
            if Path(f"/proc/{pid}/comm").read_text().strip() != "sleep":
                assert secret.encode() not in environ, pid  # only the command has it
        api = sandbox._provider.api
        info: dict[str, Any] = api.inspect_container(sandbox.container)
        assert secret not in json.dumps(info)
        for exec_id in info.get("ExecIDs") or []:
            assert secret not in json.dumps(api.exec_inspect(exec_id))
    finally:
        await proc.kill(signal.SIGKILL)
        await proc.wait()
        await proc.aclose()


async def test_a_timeout_kills_what_left_the_session_and_the_environment(
    sandbox: DockerHandle,
) -> None:
    # The command's background processes leave its session and clear their environment
    # (what the docker exec path's sweep looked for): the command's init is their
    # subreaper, so the timeout kills them all the same, and so does a normal end.
    escape = "env -i setsid sleep 301 & env -i setsid sh -c 'sleep 302 &'; "
    r = await sandbox.process.exec(["sh", "-c", escape + "sleep 300"], timeout=1)
    assert r.timed_out and r.exit_code == 124, r
    r = await sandbox.process.exec(["sh", "-c", escape + "echo done"])
    assert r.ok and r.stdout == b"done\n", r
    left = [a for _p, _pp, a in processes(sandbox) if a.startswith("sleep 30")]
    assert left == [], left


async def test_killing_the_agent_mid_command_fails_the_command_and_restarts_it(
    sandbox: DockerHandle, request: pytest.FixtureRequest,
) -> None:
    require(request.config, os.geteuid() == 0, "root (to kill the agent by its host pid)",
            "run as root")
    proc = await sandbox.process.spawn(["sh", "-c", "setsid sleep 300 & exec sleep 300"])
    await wait_until_async(
        lambda: sum(a == "sleep 300" for _p, _pp, a in processes(sandbox)) == 2,
        "the command to run")
    (agent,) = agents(sandbox)
    os.kill(agent, signal.SIGKILL)
    # The command went with its agent (its init killed its tree), and corral says so.
    with anyio.fail_after(30), pytest.raises(AgentLost, match="killed with it"):
        await proc.wait()
    await proc.aclose()
    await wait_until_async(
        lambda: not any(a == "sleep 300" or a.startswith("corral-agent")
                        for _p, _pp, a in processes(sandbox)),
        "every process of the command and the agent to be gone")
    # The next command starts a new agent, in the container, as the agent's uid.
    r = await sandbox.process.exec(["sh", "-c", "id -u; hostname"])
    assert r.ok and r.stdout == b"1000\nsandbox\n", r
    assert len(agents(sandbox)) == 1 and agents(sandbox) != [agent]


async def test_the_container_is_the_only_way_in(sandbox: DockerHandle) -> None:
    # The agent's stream is an exec of the container: the daemon records it with the
    # loader and the uid only; the container's own configuration is unchanged.
    api = sandbox._provider.api
    info = api.inspect_container(container_name(sandbox.id))
    execs = [api.exec_inspect(e) for e in info.get("ExecIDs") or []]
    loaders = [e for e in execs if e["ProcessConfig"]["arguments"][-1:] == ["1000"]
               and e["Running"]]
    assert len(loaders) == 1, execs
    assert loaders[0]["ProcessConfig"]["user"] == "0:0"


async def test_an_agent_that_cannot_start_leaves_docker_exec(corral_home: Path,
                                                             tmp_path: Path) -> None:
    # A binary the container cannot run (not a program at all): the agent does not answer,
    # the provider says why, and commands take a docker exec each, in the container.
    provider = DockerProvider()
    broken = tmp_path / "agent"
    broken.write_bytes(b"not a program\n")
    provider._agent_binary = broken
    h = await provider.create()
    try:
        r = await h.process.exec(["sh", "-c", "id -u; hostname"])
        assert r.ok and r.stdout == b"1000\nsandbox\n", r
        how, why = provider.command_path()
        assert how == "exec" and "did not start" in why, why
        assert agents(h) == []
        assert await h.fs.exists("/workspace") is True
        off = DockerProvider(agent=False)
        assert off.command_path() == ("exec", "the agent is turned off (agent = false)")
    finally:
        await provider.destroy(h.ref)
