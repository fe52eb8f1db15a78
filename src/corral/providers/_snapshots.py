"""Snapshots of host-directory sandboxes (local and bubblewrap), kept on the host.

A snapshot is a copy of the sandbox's persistent areas (``/workspace`` and
``/home/agent``; ``/tmp`` is not kept) under ``$CORRAL_HOME/snapshots/<provider>/<id>/``,
made with ``cp -a --reflink=auto``: a copy-on-write clone where the filesystem supports it
(btrfs, XFS), a plain copy elsewhere. Hard links are deliberately not used: the sandbox
edits files in place, which would change the snapshot too.

Restore creates a new sandbox and copies the snapshot's areas into it. Before a snapshot
is kept it is scanned for the live secret values; one that holds a secret is deleted and
the snapshot fails (secrets never go into a snapshot).

The local and bubblewrap providers hand one out as their ``snapshotter`` (the
:class:`~corral.sandbox._snapshots.ProvidesSnapshots` capability).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from corral._errors import CorralError
from corral.providers._base import HostDirHandle
from corral.sandbox._contracts import (
    Handle,
    ResourceLimits,
    SandboxSpec,
    SnapshotRef,
    UnsupportedCapability,
)
from corral.sandbox._leakscan import scan_paths
from corral.sandbox._redact import Redactor, live_redactor

__all__ = ["HostDirSnapshots", "SecretInSnapshotError"]

AREAS = ("workspace", "home/agent")


class SecretInSnapshotError(CorralError):
    """A snapshot would have held a secret value; it was not kept."""


def _copy_tree(src: Path, dst: Path) -> None:
    """Copy the contents of ``src`` into the existing directory ``dst`` (CoW if possible)."""
    dst.mkdir(parents=True, exist_ok=True)
    if not src.is_dir():
        return
    proc = subprocess.run(
        ["cp", "-a", "--reflink=auto", "--", f"{src}/.", f"{dst}/"],
        capture_output=True,
        check=False,
    )
    if proc.returncode != 0:
        raise CorralError(
            f"copying {src} to {dst} failed: {proc.stderr.decode('utf-8', 'replace')[-500:]}"
        )


def _clear_dir(path: Path) -> None:
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


class HostDirSnapshots:
    """Snapshots for the local and bubblewrap providers (see the module docstring)."""

    def __init__(self, provider: Any, *, redactor: Redactor | None = None) -> None:
        self._p = provider
        self._redactor = redactor

    @property
    def root(self) -> Path:
        # base_dir is $CORRAL_HOME/sandboxes/<provider>
        home = Path(self._p.base_dir).parent.parent
        path = home / "snapshots" / str(self._p.name)
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        return path

    def _dir(self, snapshot: SnapshotRef) -> Path:
        if snapshot.provider != self._p.name:
            raise CorralError(
                f"snapshot {snapshot.id!r} belongs to provider {snapshot.provider!r}, "
                f"not {self._p.name!r}"
            )
        if not snapshot.id.startswith("snap-") or "/" in snapshot.id or ".." in snapshot.id:
            raise CorralError(f"invalid snapshot id {snapshot.id!r}")
        return self.root / snapshot.id

    async def snapshot(self, handle: Handle, label: str = "") -> SnapshotRef:
        if not isinstance(handle, HostDirHandle):
            raise UnsupportedCapability(self._p.name, "snapshots", "not a host-directory sandbox")
        snap_id = "snap-" + secrets.token_hex(8)
        final = self.root / snap_id
        tmp = self.root / f".{snap_id}.tmp"
        state = handle.state
        meta = {
            "id": snap_id,
            "provider": self._p.name,
            "label": label,
            "source_sandbox": handle.id,
            "created_at": time.time(),
            "spec": {
                "env": dict(state.env),
                "network": state.network,
                "limits": asdict(state.limits),
                "binds": [list(b) for b in state.binds],
                "labels": dict(state.labels),
            },
        }
        host_root = Path(handle.host_root)

        def work() -> None:
            tmp.mkdir(mode=0o700)
            try:
                for area in AREAS:
                    _copy_tree(host_root / area, tmp / "root" / area)
                values = self._values()
                if values:
                    hits = scan_paths([tmp], values)
                    if hits:
                        where = ", ".join(
                            sorted({os.path.relpath(h.path, tmp / "root") for h in hits})[:5]
                        )
                        names = ", ".join(sorted({h.secret for h in hits}))
                        raise SecretInSnapshotError(
                            f"not snapshotting sandbox {handle.id!r}: secret {names} is written "
                            f"in {where}; keep secrets in the environment, not in files"
                        )
                (tmp / "meta.json").write_text(json.dumps(meta))
                os.rename(tmp, final)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise

        await anyio.to_thread.run_sync(work)
        return SnapshotRef(self._p.name, snap_id, label)

    def _values(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for red in (self._redactor, live_redactor()):
            if red is not None:
                out.extend(red.items())
        return out

    async def restore(self, snapshot: SnapshotRef, spec: SandboxSpec | None = None) -> Handle:
        d = self._dir(snapshot)
        try:
            meta = json.loads((d / "meta.json").read_text())
        except (OSError, ValueError):
            raise CorralError(f"snapshot {snapshot.id!r} is gone or unreadable") from None
        if spec is None:
            s = meta["spec"]
            spec = SandboxSpec(
                env=s["env"],
                network=s["network"],
                limits=ResourceLimits(**s["limits"]),
                binds=[(b[0], b[1]) for b in s["binds"]],
                labels=s["labels"],
            )
        handle = await self._p.create(spec)
        try:
            host_root = Path(handle.host_root)
            owner = os.stat(host_root / "workspace")

            def work() -> None:
                for area in AREAS:
                    target = host_root / area
                    _clear_dir(target)
                    _copy_tree(d / "root" / area, target)
                    for dirpath, dirnames, filenames in os.walk(target):
                        for name in [*dirnames, *filenames]:
                            p = os.path.join(dirpath, name)
                            st = os.lstat(p)
                            if (st.st_uid, st.st_gid) != (owner.st_uid, owner.st_gid):
                                os.lchown(p, owner.st_uid, owner.st_gid)

            await anyio.to_thread.run_sync(work)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._p.destroy(handle.ref)
            raise
        return handle  # type: ignore[no-any-return]

    async def delete(self, snapshot: SnapshotRef) -> None:
        d = self._dir(snapshot)
        await anyio.to_thread.run_sync(lambda: shutil.rmtree(d, ignore_errors=True))

    async def exists(self, snapshot: SnapshotRef) -> bool:
        return (self._dir(snapshot) / "meta.json").is_file()
