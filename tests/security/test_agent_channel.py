"""Attacks on the channel between corral and a bubblewrap sandbox's agent (#32).

Every command of a sandbox is a request to its agent over one unix socket in the
sandbox's private directory (corral.providers._bwrap_agent). Each test is an attack on
that channel with the real agent, bwrap and cgroups: reaching the socket as the
sandbox's own uid (from the host, and from inside), impersonating the agent, replaying a
captured conversation, flooding it with connections, requests and garbage, forging the
exit status from inside, finding the command's environment in a host argv, and killing
the agent in the middle of a command.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from corral.providers import _cgroups as cgroups
from corral.providers._agent_client import AgentConnection, AgentLost, frame, hello_answer
from corral.providers._bwrap_agent import connect_unix
from corral.providers._process import Outcome
from corral.providers._bubblewrap import BubblewrapHandle, BubblewrapProvider, launch_fields
from corral.sandbox._contracts import ResourceLimits, SandboxSpec
from corral.testing import wait_until_async
from corral.testing._plugin import require
from tests.helpers import agent_resident, idle_spare

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("need_bwrap_runs")]

PY = "/usr/bin/python3"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def sandbox(corral_home: Path) -> AsyncIterator[BubblewrapHandle]:
    provider = BubblewrapProvider()
    h = await provider.create()
    try:
        assert (await h.process.exec(["true"])).ok  # the agent is up
        assert provider.command_path()[0] == "agent", provider.command_path()
        yield h
    finally:
        await provider.destroy(h.ref)


def private(h: BubblewrapHandle) -> Path:
    return h._dir / "private"


def agent_pid(h: BubblewrapHandle) -> int:
    pids = [p for p in agent_resident(h.state.cgroups)
            if Path(f"/proc/{p}/comm").read_text().strip() == "corral-agent"]
    assert len(pids) == 1, pids
    return pids[0]


def as_uid(uid: int, code: str, pass_fds: tuple[int, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-c", code], user=uid, group=uid, extra_groups=[],
                          capture_output=True, text=True, timeout=60, pass_fds=pass_fds,
                          check=False)


async def test_the_sandboxs_uid_cannot_reach_the_socket_from_the_host(
    sandbox: BubblewrapHandle, request: pytest.FixtureRequest
) -> None:
    # The host uid the sandbox runs as (root mode) tries to connect to the agent's socket
    # and to bind one in its place (to impersonate the agent), even given a descriptor of
    # the private directory: the directory is corral's, mode 0700.
    uid = sandbox.state.host_uid
    require(request.config, uid is not None, "root (sandboxes run as another host uid)",
            "run as root")
    assert uid is not None
    st = os.stat(private(sandbox))
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o700)
    dfd = os.open(private(sandbox), os.O_PATH | os.O_DIRECTORY)
    try:
        code = (
            "import socket\n"
            f"for path in ('/proc/self/fd/{dfd}/agent.sock',):\n"
            "    s = socket.socket(socket.AF_UNIX)\n"
            "    try: s.connect(path); print('connected')\n"
            "    except PermissionError: print('refused')\n"
            "    s = socket.socket(socket.AF_UNIX)\n"
            f"    try: s.bind('/proc/self/fd/{dfd}/evil.sock'); print('bound')\n"
            "    except PermissionError: print('refused')\n"
            f"try: open('/proc/self/fd/{dfd}/agent.key').read(); print('read the key')\n"
            "except PermissionError: print('refused')\n"
        )
        done = as_uid(uid, code, pass_fds=(dfd,))
    finally:
        os.close(dfd)
    assert done.stdout.split() == ["refused"] * 3, (done.stdout, done.stderr)


async def test_a_command_finds_no_way_to_the_agents_socket(sandbox: BubblewrapHandle) -> None:
    # From inside: every unix socket the sandbox's network namespace lists, every path
    # of the host socket, and abstract names; none leads to the agent.
    probe = (
        "import socket\n"
        "names = [l.split()[-1] for l in open('/proc/net/unix').read().splitlines()[1:]"
        " if len(l.split()) > 7]\n"
        f"names += [{str(private(sandbox) / 'agent.sock')!r}, '/run/corral-agent']\n"
        "ok = 0\n"
        "for n in names:\n"
        "    s = socket.socket(socket.AF_UNIX)\n"
        "    try: s.connect(n.replace('@', '\\0', 1) if n.startswith('@') else n); ok += 1\n"
        "    except OSError: pass\n"
        "print('reached', ok)\n"
    )
    r = await sandbox.process.exec([PY, "-c", probe])
    assert r.stdout == b"reached 0\n", r


async def test_a_replayed_conversation_runs_nothing(sandbox: BubblewrapHandle) -> None:
    # A captured conversation (the hello answer and a start request, byte for byte) sent
    # again on a new connection: the agent's nonce is new, the answer is wrong, the
    # connection is closed before the request is read.
    marker = "/workspace/replayed"
    key = bytes.fromhex((private(sandbox) / "agent.key").read_text())
    conn = await AgentConnection.open(connect_unix(private(sandbox) / "agent.sock"), key,
                                      what="test")
    blob = launch_fields("/workspace", {"PATH": "/usr/bin:/bin"}, ["touch", marker])
    assert conn._nonce is not None
    captured = frame(0, b"H", hello_answer(key, conn._nonce)) + frame(1, b"S", blob)
    conn.close()
    for _ in range(3):
        s = connect_unix(private(sandbox) / "agent.sock")
        s.settimeout(10)
        s.sendall(captured)
        got = b""
        while chunk := s.recv(4096):  # the agent hangs up
            got += chunk
        s.close()
        assert got[8:9] == b"n" and len(got) == 4 + 5 + 32, got  # only its nonce
    r = await sandbox.process.exec(["ls", "/workspace"])
    assert r.ok and b"replayed" not in r.stdout, r


async def test_the_one_time_token_of_a_fresh_agent_works_once(
    sandbox: BubblewrapHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fresh agent lets the process that started it in with a one-time token (no round
    # trip). Captured and replayed with a start request, it is refused: used once, gone.
    tokens: list[bytes] = []
    real = AgentConnection.with_token.__func__  # type: ignore[attr-defined]

    def spy(cls: type[AgentConnection], sock: socket.socket, token: bytes, *,
            what: str) -> AgentConnection:
        tokens.append(token)
        conn: AgentConnection = real(cls, sock, token, what=what)
        return conn

    monkeypatch.setattr(AgentConnection, "with_token", classmethod(spy))
    os.kill(agent_pid(sandbox), signal.SIGKILL)
    cg = sandbox.state.cgroups
    await wait_until_async(lambda: not cgroups.members(cg), "the agent to be gone")
    assert (await sandbox.process.exec(["true"])).ok  # a new agent, through its token
    assert len(tokens) == 1
    blob = launch_fields("/workspace", {"PATH": "/usr/bin:/bin"}, ["touch", "/workspace/again"])
    s = connect_unix(private(sandbox) / "agent.sock")
    s.settimeout(10)
    s.sendall(frame(0, b"T", tokens[0]) + frame(1, b"S", blob))
    got = b""
    while chunk := s.recv(4096):
        got += chunk
    s.close()
    assert got[8:9] == b"n" and len(got) == 4 + 5 + 32, got  # its nonce, then it hung up
    r = await sandbox.process.exec(["ls", "/workspace"])
    assert r.ok and b"again" not in r.stdout, r


@pytest.fixture
async def small(corral_home: Path) -> AsyncIterator[BubblewrapHandle]:
    """A sandbox with a pids limit of 64, its agent up."""
    provider = BubblewrapProvider()
    h = await provider.create(SandboxSpec(limits=ResourceLimits(pids=64)))
    try:
        assert (await h.process.exec(["true"])).ok
        yield h
    finally:
        await provider.destroy(h.ref)


async def test_a_flood_of_connections_requests_and_garbage_leaves_the_agent_serving(
    small: BubblewrapHandle, request: pytest.FixtureRequest
) -> None:
    sandbox = small
    require(request.config, bool(sandbox.state.cgroups), "cgroups (the pids limit)", "run as root")
    path = private(sandbox) / "agent.sock"
    key = bytes.fromhex((private(sandbox) / "agent.key").read_text())
    pid = agent_pid(sandbox)
    # 1. More connections than the agent keeps, never authenticated: the rest are refused.
    idle = []
    for _ in range(100):
        idle.append(connect_unix(path))
    # 2. Garbage: a huge length, an unknown frame, a start before the hello.
    for junk in (struct.pack("<IIB", 0xFFFFFFF0, 1, ord("S")), b"\0" * 9,
                 frame(1, b"S", b"/\0" + b"0\0" + b"true\0")):
        with contextlib.suppress(OSError):  # refused while full, or hung up on at once
            s = connect_unix(path)
            s.settimeout(10)
            s.sendall(junk)
            s.close()
    for s in idle:
        s.close()
    # 3. An authenticated connection floods start requests (a fork bomb through the
    # channel): the pids limit holds, and everything is answered.
    conn = await AgentConnection.open(connect_unix(path), key, what="test")
    blob = launch_fields("/", {"PATH": "/usr/bin:/bin"}, ["sleep", "30"])

    def finish(status: int | None, reported: bool) -> Outcome:
        return Outcome(0)

    procs = []
    for _ in range(300):
        procs.append(await conn.start(blob, finish, lambda: False))
    pids_dir = next(d for d in sandbox.state.cgroups if "/pids/" in d)
    limit = int(Path(pids_dir, "pids.max").read_text())
    with anyio.fail_after(60):  # every request answered: started, or refused (no pids)
        await conn._until(lambda: all(p._cmd.started or p._cmd.error for p in procs))
    # The limit refused most: the agent could not fork, or the command's init could not.
    await conn._until(lambda: sum(p._cmd.error is not None or p._cmd.status is not None
                                  for p in procs) >= 300 - limit)
    assert int(Path(pids_dir, "pids.peak").read_text()) <= limit
    for p in procs:
        await p.kill(signal.SIGKILL)
    with anyio.fail_after(60):
        await conn._until(lambda: all(p._cmd.error is not None or p._cmd.status is not None
                                      for p in procs))
    conn.close()
    cg = sandbox.state.cgroups
    await wait_until_async(lambda: cgroups.members(cg) <= agent_resident(cg) | idle_spare(cg),
                           "the flood's processes to be gone")
    # The agent is the same process and serves the handle as before.
    assert agent_pid(sandbox) == pid
    r = await sandbox.process.exec(["sh", "-c", "echo still here"])
    assert r.ok and r.stdout == b"still here\n", r


async def test_a_command_cannot_forge_its_status_on_the_channel(sandbox: BubblewrapHandle) -> None:
    # The command writes what an exit frame with status 0 looks like on every descriptor
    # it has, then fails: corral reports its real status, and the bytes as its output.
    forged = frame(1, b"x", struct.pack("<iB", 0, 1))
    script = (
        "import os, sys\n"
        f"f = {forged!r}\n"
        "for fd in map(int, os.listdir('/proc/self/fd')):\n"
        "    try: os.write(fd, f)\n"
        "    except OSError: pass\n"
        "sys.exit(7)\n"
    )
    r = await sandbox.process.exec([PY, "-c", script])
    assert (r.exit_code, r.signal) == (7, None), r
    assert forged in r.stdout


async def test_the_commands_environment_is_in_no_host_argv(sandbox: BubblewrapHandle) -> None:
    secret = "s3cr3t-" + os.urandom(8).hex()
    proc = await sandbox.process.spawn(["sleep", "30"], env={"API_TOKEN": secret})
    try:
        await wait_until_async(lambda: len(cgroups.members(sandbox.state.cgroups)) >= 4,
                               "the command to run")
        for pid in cgroups.members(sandbox.state.cgroups):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                environ = Path(f"/proc/{pid}/environ").read_bytes()
            except OSError:
                continue
            assert secret.encode() not in cmdline, pid
            if Path(f"/proc/{pid}/comm").read_text().strip() != "sleep":
                assert secret.encode() not in environ, pid  # only the command has it
    finally:
        await proc.kill(signal.SIGKILL)
        await proc.wait()
        await proc.aclose()


async def test_killing_the_agent_mid_command_fails_the_command_and_restarts_it(
    sandbox: BubblewrapHandle,
) -> None:
    proc = await sandbox.process.spawn(["sh", "-c", "sleep 300 & exec sleep 300"])
    cg = sandbox.state.cgroups
    await wait_until_async(lambda: len(cgroups.members(cg)) >= 5, "the command to run")
    os.kill(agent_pid(sandbox), signal.SIGKILL)
    # The command went with its agent, and corral says so instead of a status.
    with anyio.fail_after(30), pytest.raises(AgentLost, match="killed with it"):
        await proc.wait()
    await proc.aclose()
    await wait_until_async(lambda: not cgroups.members(cg), "every process to be gone")
    # The next command starts a new agent (and never runs outside the sandbox).
    r = await sandbox.process.exec(["sh", "-c", "cat /proc/self/cgroup; id -u"])
    assert r.ok and r.stdout.endswith(b"\n1000\n"), r
    assert all(line.endswith(":/") for line in r.stdout.decode().splitlines()[:-1]), r.stdout
    assert len(agent_resident(cg)) == 2
    # Killed between two commands: the next one notices before sending, and starts a
    # new agent (nothing is sent to a dead one, nothing runs twice).
    os.kill(agent_pid(sandbox), signal.SIGKILL)
    await wait_until_async(lambda: not cgroups.members(cg), "the agent to be gone")
    r = await sandbox.process.exec(["echo", "once"])
    assert r.ok and r.stdout == b"once\n", r
