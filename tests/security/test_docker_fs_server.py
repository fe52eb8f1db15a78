"""Attacks on a docker sandbox's file server (#32, corral.providers._docker_fs_server).

A docker handle's file operations go to one long-lived helper process (the ``serve`` mode
of corral._insandbox.container), started through the agent as the agent's uid. Each test
is an attack on it with the real agent and dockerd, from a process of the agent's uid:
reaching the server's pipes, memory or a trace; killing it in the middle of a read and
while it is idle; a server that answers forged frames; a symlink swapped back and forth
under reads and writes; file contents and names that look like the protocol. The rule:
a clear error or the true answer, never a wrong answer presented as true.
"""

from __future__ import annotations

import errno
import os
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from corral.providers._docker import (
    BASE_ENV,
    WORKDIR,
    DockerHandle,
    DockerProvider,
    _helper_outcome,
)
from corral.providers._docker_agent import launch_fields
from corral.providers._docker_fs_server import FsServers
from corral.sandbox._contracts import PathEscapeError

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("need_docker")]

PY = "/usr/bin/python3"
SERVERS = (
    "import os\n"
    "def servers():\n"
    "    out = []\n"
    "    for p in os.listdir('/proc'):\n"
    "        if not p.isdigit(): continue\n"
    "        try: argv = open(f'/proc/{p}/cmdline', 'rb').read().split(b'\\0')\n"
    "        except OSError: continue\n"
    "        if argv[:1] == [b'python3'] and argv[-2:] == [b'serve', b'']: out.append(int(p))\n"
    "    return out\n"
)
"""Finds the file servers from inside (their argv: the helper's source, then ``serve``)."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def sandbox(corral_home: Path) -> AsyncIterator[DockerHandle]:
    provider = DockerProvider()
    h = await provider.create()
    try:
        assert (await h.process.exec(["true"])).ok
        assert provider.command_path()[0] == "agent", provider.command_path()
        yield h
    finally:
        await provider.destroy(h.ref)


async def inside(h: DockerHandle, code: str) -> str:
    r = await h.process.exec([PY, "-c", SERVERS + code])
    assert r.ok, r
    return r.stdout.decode()


async def test_the_agents_uid_cannot_reach_the_servers_pipes_memory_or_trace_it(
    sandbox: DockerHandle,
) -> None:
    await sandbox.fs.write("a", b"x")  # a server is up (and idle)
    probe = (
        "import ctypes\n"
        "found, opened = servers(), 0\n"
        "for p in found:\n"
        "    assert os.stat(f'/proc/{p}/fd').st_uid == 0  # non-dumpable: root's entries\n"
        "    for path, mode in ((f'/proc/{p}/fd/0', 'rb'), (f'/proc/{p}/fd/0', 'wb'),\n"
        "                       (f'/proc/{p}/fd/1', 'wb'), (f'/proc/{p}/fd/1', 'rb'),\n"
        "                       (f'/proc/{p}/mem', 'rb'), (f'/proc/{p}/environ', 'rb')):\n"
        "        try: open(path, mode, buffering=0); opened += 1\n"
        "        except OSError: pass\n"
        "    libc = ctypes.CDLL(None, use_errno=True)\n"
        "    if libc.ptrace(16, p, 0, 0) == 0: opened += 1\n"  # PTRACE_ATTACH
        "print(len(found), opened)\n"
    )
    found, opened = map(int, (await inside(sandbox, probe)).split())
    assert (found, opened) == (1, 0)
    assert await sandbox.fs.read("a") == b"x"  # and it still serves


async def test_a_server_killed_mid_read_fails_the_read_and_is_replaced(
    sandbox: DockerHandle,
) -> None:
    data = os.urandom(12 << 20)
    await sandbox.fs.write("big", data)
    stream = sandbox.fs.read_stream("big", 1 << 20)
    got = [await stream.__anext__()]
    # The server is blocked on its output (the agent's window is full): kill it from inside.
    killed = await inside(sandbox, "import signal\nfor p in servers(): os.kill(p, 9); "
                                   "print(p)\n")
    assert killed.strip()
    with pytest.raises(OSError) as caught:
        async for chunk in stream:
            got.append(chunk)
    assert caught.value.errno == errno.EIO and "ended before it answered" in str(caught.value)
    assert sum(map(len, got)) < len(data)  # what came is never taken for the whole
    await stream.aclose()
    assert await sandbox.fs.read("big") == data  # a new server
    assert (await inside(sandbox, "print(servers())")).strip() not in ("[]", f"[{killed.strip()}]")


async def test_a_server_killed_while_idle_is_replaced(sandbox: DockerHandle) -> None:
    await sandbox.fs.write("f", b"one")
    for _ in range(3):
        killed = await inside(sandbox, "print([os.kill(p, 9) or p for p in servers()])")
        assert killed.strip() not in ("", "[]")
        assert await sandbox.fs.read("f") == b"one"
        await sandbox.fs.write("f", b"one")
        assert (await sandbox.fs.stat("f")).size == 3


FORGERS = {
    # a read whose bytes do not add up to the size it gives
    "short": "fr(b'd', b'forged'); fr(b'o', b'{\"size\": 999}')",
    # a frame longer than any the server sends
    "huge": "os.write(1, b'd' + (1 << 30).to_bytes(4, 'big'))",
    # an unknown kind, then silence
    "kind": "fr(b'z', b'')",
    # a stat answer of the wrong shape, a list of junk
    "junk": "fr(b'o', b'{\"path\": 1}')",
    # it says it is ready, then dies without answering
    "dies": "os._exit(0)",
}


@pytest.mark.parametrize("how", sorted(FORGERS))
async def test_a_forged_server_gets_an_error_never_its_answer(sandbox: DockerHandle,
                                                             how: str) -> None:
    # A process of the agent's uid in the server's place: it answers every request with
    # forged frames. Every operation fails (an OSError), none returns the forgery.
    script = (
        "import os\n"
        "def fr(k, p): os.write(1, k + len(p).to_bytes(4, 'big') + p)\n"
        "fr(b'r', b'')\n"
        "while True:\n"
        "    n = os.read(0, 1 << 16)\n"
        "    if not n: break\n"
        f"    {FORGERS[how]}\n"
    )

    async def forged() -> object:
        conn = await sandbox._agent()
        assert conn is not None
        blob = launch_fields(WORKDIR, BASE_ENV, [PY, "-c", script])
        return await conn.start(blob, _helper_outcome, sandbox._gone)

    sandbox.fs_servers = FsServers(forged, sandbox._gone,  # type: ignore[arg-type]
                                   sandbox.fs_servers._fs_error, "test")
    for op in (sandbox.fs.read("f"), sandbox.fs.stat("f"), sandbox.fs.list("/workspace"),
               sandbox.fs.exists("f")):
        with anyio.fail_after(30), pytest.raises(OSError) as caught:
            await op
        assert caught.value.errno == errno.EIO, caught.value


async def test_a_server_that_cannot_start_leaves_the_helper_per_operation(
    sandbox: DockerHandle,
) -> None:
    async def broken() -> object:
        conn = await sandbox._agent()
        assert conn is not None
        blob = launch_fields(WORKDIR, BASE_ENV, ["sh", "-c", "echo no server >&2; exit 4"])
        return await conn.start(blob, _helper_outcome, sandbox._gone)

    sandbox.fs_servers = FsServers(broken, sandbox._gone,  # type: ignore[arg-type]
                                   sandbox.fs_servers._fs_error, "test")
    await sandbox.fs.write("f", b"still")
    assert await sandbox.fs.read("f") == b"still"
    problem = sandbox.fs_servers.problem or ""
    assert "did not start" in problem and "no server" in problem, problem


async def test_a_symlink_swapped_under_reads_and_writes_never_leads_out(
    sandbox: DockerHandle,
) -> None:
    # /workspace/s flips between a real directory and symlinks to /etc and /dev/shm (a
    # tmpfs outside the writable areas that the agent's uid may write to) as fast as the
    # agent's uid can swap names (atomically: s always exists); reads give the directory's
    # file or an error, and no write lands outside.
    await sandbox.fs.write("d/hostname", b"inside")
    swap = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "os.chdir('/workspace')\n"
        "os.rename('d', 's'); os.symlink('/etc', 'l1'); os.symlink('/dev/shm', 'l2')\n"
        "def swap(a):\n"  # renameat2(AT_FDCWD, a, AT_FDCWD, "s", RENAME_EXCHANGE)
        "    assert libc.renameat2(-100, a, -100, b's', 2) == 0, ctypes.get_errno()\n"
        "print('go', flush=True)\n"
        "while True:\n"
        "    for n in (b'l1', b'l2'):\n"
        "        swap(n); swap(n)\n"
    )
    proc = await sandbox.process.spawn([PY, "-c", swap])
    try:
        assert await proc.stdout.__anext__() == b"go\n"
        seen: dict[str, int] = {}
        for i in range(300):
            try:
                got = await sandbox.fs.read("s/hostname")
                assert got == b"inside", got
                seen["inside"] = seen.get("inside", 0) + 1
            except PathEscapeError:
                seen["escape"] = seen.get("escape", 0) + 1
            except OSError as exc:
                seen[errno.errorcode.get(exc.errno or 0, "?")] = seen.get(
                    errno.errorcode.get(exc.errno or 0, "?"), 0) + 1
            try:
                await sandbox.fs.write(f"s/w{i}", b"w")
            except OSError:
                pass
    finally:
        await proc.kill()
        await proc.wait()
        await proc.aclose()
    assert seen.get("escape", 0) > 0, seen  # the race was on
    r = await sandbox.process.exec(["sh", "-c", "ls /dev/shm | wc -l"])
    assert r.ok and r.stdout.strip() == b"0", r


async def test_contents_and_names_that_look_like_frames_are_data(sandbox: DockerHandle) -> None:
    forged = b"o\0\0\0\x04null" + b"e\0\0\0\x02{}" + b"d\xff\xff\xff\xff"
    name = 'o\x01{"size": 0}'
    await sandbox.fs.write(name, forged)
    assert await sandbox.fs.read(name) == forged
    assert b"".join([c async for c in sandbox.fs.read_stream(name, 3)]) == forged
    (info,) = [i for i in await sandbox.fs.list("/workspace") if i.name == name]
    assert info.size == len(forged)


async def test_concurrent_and_nested_operations_each_get_a_server(
    sandbox: DockerHandle,
) -> None:
    blobs = {f"c{i}": os.urandom(1000 * (i + 1)) for i in range(8)}
    async with anyio.create_task_group() as tg:
        for name, data in blobs.items():
            tg.start_soon(sandbox.fs.write, name, data)
    results: dict[str, bytes] = {}

    async def read(name: str) -> None:
        results[name] = await sandbox.fs.read(name)

    async with anyio.create_task_group() as tg:
        for name in blobs:
            tg.start_soon(read, name)
    assert results == blobs
    # A read stream held open while other operations run (its server is busy).
    with anyio.fail_after(30):
        stream = sandbox.fs.read_stream("c7", 100)
        first = await stream.__anext__()
        await sandbox.fs.write("other", b"o")
        assert await sandbox.fs.read("other") == b"o"
        rest = b"".join([c async for c in stream])
    assert first + rest == blobs["c7"]


async def test_a_server_killed_as_it_starts_fails_the_operation_not_the_servers(
    sandbox: DockerHandle,
) -> None:
    # Killed before it says it is ready (by the agent's uid, say): that operation fails
    # with EIO; the sandbox keeps its file servers (no fall back for good).
    async def killed() -> object:
        conn = await sandbox._agent()
        assert conn is not None
        blob = launch_fields(WORKDIR, BASE_ENV, [PY, "-c", "import os; os.kill(os.getpid(), 9)"])
        return await conn.start(blob, _helper_outcome, sandbox._gone)

    servers = FsServers(killed, sandbox._gone,  # type: ignore[arg-type]
                        sandbox.fs_servers._fs_error, "test")
    sandbox.fs_servers = servers
    with pytest.raises(OSError) as caught:
        await sandbox.fs.read("f")
    assert caught.value.errno == errno.EIO and "killed as it started" in str(caught.value)
    assert servers.problem is None
