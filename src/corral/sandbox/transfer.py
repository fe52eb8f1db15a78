"""Stream a host directory into a sandbox as a tar archive.

The archive is unpacked *inside* the sandbox (``tar -x`` as the sandbox's user), so
symlinks already in the workspace resolve within the sandbox and cannot redirect a write
onto the host, and ownership comes out right without any chown on the host.
"""

from __future__ import annotations

import fnmatch
import io
import os
import tarfile
from collections.abc import Sequence
from pathlib import Path

import anyio
import anyio.to_thread

from corral.errors import CorralError
from corral.sandbox.contracts import Handle

__all__ = ["TransferError", "copy_dir_into"]

CHUNK = 1 << 20


class TransferError(CorralError):
    """Copying files into the sandbox failed."""


def _excluded(rel: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(os.path.basename(rel), p) for p in patterns)


def _build_tar(source: Path, exclude: Sequence[str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(source):
            rel_dir = os.path.relpath(dirpath, source)
            keep = []
            for d in sorted(dirnames):
                rel = os.path.normpath(os.path.join(rel_dir, d))
                if not _excluded(rel, exclude):
                    keep.append(d)
            dirnames[:] = keep
            for name in [*keep, *sorted(filenames)]:
                rel = os.path.normpath(os.path.join(rel_dir, name))
                if _excluded(rel, exclude):
                    continue
                info = tar.gettarinfo(os.path.join(dirpath, name), arcname=rel)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                if info.isfile():
                    with open(os.path.join(dirpath, name), "rb") as f:
                        tar.addfile(info, f)
                elif info.isdir() or info.issym():
                    tar.addfile(info)
                # devices, fifos and sockets are not copied
    return buf.getvalue()


async def copy_dir_into(
    handle: Handle, source: Path, dest: str = "/workspace", *, exclude: Sequence[str] = ()
) -> None:
    """Copy the contents of host directory ``source`` into ``dest`` in the sandbox."""
    if not source.is_dir():
        raise TransferError(f"{source} is not a directory on the host")
    data = await anyio.to_thread.run_sync(_build_tar, source, tuple(exclude))
    await handle.fs.mkdir(dest, parents=True)
    result = await handle.process.exec(
        ["tar", "-x", "-f", "-", "--no-same-owner", "--no-same-permissions", "--delay-directory-restore"],
        cwd=dest,
        stdin=data,
        timeout=600,
    )
    if not result.ok:
        err = result.stderr.decode("utf-8", "replace")[-1000:]
        raise TransferError(f"unpacking {source} into {dest} failed ({result.describe()}): {err}")
