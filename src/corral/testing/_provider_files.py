"""Provider kit, the sandbox's files through its confined file API: round trips, streams,
listing, and what is planted inside (``..``, FIFOs, symlinks) never reaching the host."""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator

import anyio

from corral.sandbox._contracts import PathEscapeError
from corral.testing._kit import Kit, raises
from corral.testing._provider_case import ProviderCase, provider_case

__all__ = ["FILE_CHECKS"]

FILE_CHECKS: Kit[ProviderCase] = Kit("provider", subject=provider_case)
"""This part's checks, in the order written (:data:`~corral.testing.PROVIDER_KIT` joins the
parts)."""


@FILE_CHECKS.add
async def check_binary_round_trip(case: ProviderCase) -> None:
    sandbox = await case.sandbox()
    data = bytes(range(256)) * 100 + b"\x00\xff\r\n"
    await sandbox.fs.write("dir/bin.dat", data)
    assert await sandbox.fs.read("dir/bin.dat") == data
    assert await sandbox.fs.read("/workspace/dir/bin.dat") == data
    await sandbox.fs.write("/tmp/t.txt", b"tmp")
    assert await sandbox.fs.read("/tmp/t.txt") == b"tmp"
    if not case.posix_shell:
        return
    r = await sandbox.process.exec("sha256sum dir/bin.dat")
    assert r.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()
    # Files the sandbox writes can be read, and files we write can be changed inside.
    r = await sandbox.process.exec("printf inside > dir/bin.dat && printf new > dir/made")
    assert r.ok, r
    assert await sandbox.fs.read("dir/made") == b"new"
    r = await sandbox.process.exec("cat /tmp/t.txt 2>/dev/null || cat \"$TMPDIR/t.txt\"")
    assert r.stdout == b"tmp"


@FILE_CHECKS.add
async def check_hundred_megabytes_stream(case: ProviderCase) -> None:
    sandbox = await case.sandbox()
    mb = 1 << 20
    digest = hashlib.sha256()

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(100):
            block = i.to_bytes(4, "big") * (mb // 4)
            digest.update(block)
            yield block

    assert await sandbox.fs.write_stream("big.bin", chunks()) == 100 * mb
    back = hashlib.sha256()
    size = 0
    async for chunk in sandbox.fs.read_stream("big.bin", chunk_size=mb):
        assert len(chunk) <= mb
        size += len(chunk)
        back.update(chunk)
    assert size == 100 * mb and back.hexdigest() == digest.hexdigest()
    assert (await sandbox.fs.stat("big.bin")).size == 100 * mb


@FILE_CHECKS.add
async def check_list_stat_rename_remove(case: ProviderCase) -> None:
    sandbox = await case.sandbox()
    fs = sandbox.fs
    await fs.mkdir("a/b/c")
    await fs.write("a/one.txt", b"1")
    await fs.write("a/b/two.txt", b"22")
    names = {(i.name, i.type) for i in await fs.list("a")}
    assert names == {("b", "dir"), ("one.txt", "file")}
    info = await fs.stat("a/b/two.txt")
    assert (info.type, info.size, info.path) == ("file", 2, "/workspace/a/b/two.txt")
    await fs.rename("a/one.txt", "a/b/uno.txt")
    assert not await fs.exists("a/one.txt") and await fs.read("a/b/uno.txt") == b"1"
    with raises(OSError):
        await fs.remove("a/b")  # not empty, not recursive
    await fs.remove("a/b/uno.txt")
    assert not await fs.exists("a/b/uno.txt")
    await fs.remove("a", recursive=True)
    assert not await fs.exists("a")
    with raises(FileNotFoundError):
        await fs.read("a/b/two.txt")
    with raises(FileNotFoundError):
        await fs.remove("nothing-here")
    await fs.mkdir("dup", parents=False)
    with raises(FileExistsError):
        await fs.mkdir("dup", parents=False)
    await fs.mkdir("dup")  # parents=True accepts an existing directory


@FILE_CHECKS.add
async def check_dotdot_and_absolute_paths_cannot_escape(case: ProviderCase) -> None:
    sandbox = await case.sandbox()
    fs = sandbox.fs
    # Host paths outside every sandbox area (/workspace, /tmp, home): a checkout under
    # /tmp would name a path that is legitimately inside the sandbox's own /tmp.
    here = "/usr/bin/env"
    for bad in ("../../../../etc/passwd", "/etc/passwd", here, "/workspace/../etc/hostname",
                "/home/agent/../../etc/passwd", "/"):
        with raises(PathEscapeError):
            await fs.read(bad)
    for bad in ("../escape.txt", "/etc/corral-escape", "/usr/lib/corral-escape",
                "/proc/self/environ"):
        with raises(PathEscapeError):
            await fs.write(bad, b"x")
    assert not os.path.exists("/etc/corral-escape")
    assert not os.path.exists("/usr/lib/corral-escape")
    with raises(PathEscapeError):
        await fs.list("/")
    with raises(PathEscapeError):
        await fs.remove("/workspace")
    with raises(PathEscapeError):
        await fs.rename("/workspace", "/tmp/ws")


@FILE_CHECKS.add
async def check_fifos_planted_inside_never_block_the_host(case: ProviderCase) -> None:
    """A named pipe the sandbox made is no file to read or write: refused at once
    (opening it would block the host until the sandbox chose to connect)."""
    case.need_shell()
    sandbox = await case.sandbox()
    r = await sandbox.process.exec("mkfifo pipe")
    assert r.ok, r
    with anyio.fail_after(10):
        with raises(OSError):
            await sandbox.fs.read("pipe")
        with raises(OSError):
            await sandbox.fs.write("pipe", b"x")


@FILE_CHECKS.add
async def check_symlinks_planted_inside_cannot_reach_out(case: ProviderCase) -> None:
    case.need_shell()
    sandbox = await case.sandbox()
    tmp_path = case.scratch
    fs = sandbox.fs
    outside = os.path.join(str(tmp_path), "outside.txt")
    with open(outside, "wb") as fh:
        fh.write(b"host secret")
    os.chmod(str(tmp_path), 0o755)
    os.chmod(outside, 0o644)
    r = await sandbox.process.exec(
        f"ln -s {outside} to_host && ln -s /etc/passwd to_etc && ln -s /etc etcdir && "
        "ln -s ../../../../../../../../etc/passwd rel_up && ln -s / rootdir && "
        f"ln -s {os.path.dirname(outside)} hostdir && "
        "echo fine > real && ln -s real in_rel && ln -s /workspace/real in_abs"
    )
    assert r.ok, r
    for link in ("to_host", "to_etc", "rel_up", "etcdir/passwd", "rootdir/etc/passwd",
                 "hostdir/outside.txt"):
        with raises((PathEscapeError, FileNotFoundError)):
            data = await fs.read(link)
            raise AssertionError(f"read through {link!r} returned {data[:40]!r}")
    for link in ("to_host", "to_etc", "etcdir/corral", "hostdir/outside.txt", "hostdir/new"):
        # Refused, or resolved in the sandbox's own view where the target is absent.
        with raises((PathEscapeError, FileNotFoundError)):
            await fs.write(link, b"pwned")
    with raises(PathEscapeError):
        await fs.list("etcdir")
    with raises((PathEscapeError, FileNotFoundError)):
        await fs.remove("hostdir/outside.txt")
    with raises((PathEscapeError, FileNotFoundError)):
        await fs.rename("hostdir/outside.txt", "stolen")
    with raises((PathEscapeError, FileNotFoundError)):
        await fs.mkdir("hostdir/newdir")
    with open(outside, "rb") as fh:
        assert fh.read() == b"host secret"
    assert not os.path.exists(os.path.join(os.path.dirname(outside), "new"))
    assert not os.path.exists(os.path.join(os.path.dirname(outside), "newdir"))
    # Links that stay inside are fine, and removing a link removes only the link.
    assert await fs.read("in_rel") == b"fine\n"
    assert await fs.read("in_abs") == b"fine\n"
    assert (await fs.stat("to_host")).type == "symlink"
    await fs.remove("to_host")
    with open(outside, "rb") as fh:
        assert fh.read() == b"host secret"
