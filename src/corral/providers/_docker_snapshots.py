"""Snapshots of docker sandboxes: images made by ``commit``, without secrets.

A sandbox's writable areas are volumes, which ``docker commit`` leaves out, and its
container's configuration holds the spec's environment. So a snapshot is taken from
neither: the areas are read through the API (``get_archive``), scanned for the run's secret
values (a hit refuses the snapshot, naming the secret and the file), written into a fresh,
never-started container of the sandbox's image that has no environment of its own
(``put_archive``), and that container is committed as ``corral-snapshot:<id>``. Secrets
reach commands only per exec, so neither the image's configuration nor its layers can
hold them. A restore creates a sandbox from the image: new volumes are filled from it.
"""

from __future__ import annotations

import posixpath
import secrets
import tempfile
from typing import Any

import anyio
import anyio.to_thread

from corral.providers._docker import AREAS_SNAPSHOT, DockerHandle
from corral.providers._docker_client import LABEL, docker_errors
from corral.providers._snapshots import SecretInSnapshotError
from corral.sandbox._contracts import Handle, SandboxSpec, SnapshotRef, UnsupportedCapability
from corral.sandbox._redact import Redactor, live_redactor

__all__ = ["SNAPSHOT_REPO", "DockerSnapshots"]

SNAPSHOT_REPO = "corral-snapshot"
_CHUNK = 1 << 20


class DockerSnapshots:
    """The :class:`~corral.sandbox._snapshots.Snapshotter` of a docker provider."""

    def __init__(self, provider: Any, *, redactor: Redactor | None = None) -> None:
        self._p = provider
        self._redactor = redactor

    def _values(self) -> list[tuple[str, bytes]]:
        out: list[tuple[str, bytes]] = []
        for red in (self._redactor, live_redactor()):
            if red is not None:
                out.extend((name, value.encode()) for name, value in red.items() if value)
        return out

    def _scan(self, fh: Any, values: list[tuple[str, bytes]], where: str) -> None:
        """Refuse when the tar in ``fh`` holds a secret value (chunks overlap, so a value
        split across two reads is found)."""
        if not values:
            return
        longest = max(len(v) for _, v in values)
        fh.seek(0)
        tail = b""
        while chunk := fh.read(_CHUNK):
            window = tail + chunk
            for name, value in values:
                if value in window:
                    raise SecretInSnapshotError(
                        f"not snapshotting the sandbox: secret {name} is written in {where}; "
                        "keep secrets in the environment, not in files")
            tail = window[-longest:]

    async def snapshot(self, handle: Handle, label: str = "") -> SnapshotRef:
        if not isinstance(handle, DockerHandle):
            raise UnsupportedCapability("docker", "snapshots", "not a docker sandbox")
        snap_id = "snap-" + secrets.token_hex(8)
        api = self._p.api
        values = self._values()
        # the provider's own image, not the sandbox's (which may be an older snapshot:
        # files deleted since would come back from its layers)
        image = self._p.image

        def work() -> None:
            helper = api.create_container(
                image, command=["true"], labels={LABEL: "1", "corral.snapshot": snap_id},
                network_disabled=True)["Id"]
            try:
                for area in AREAS_SNAPSHOT:
                    with tempfile.TemporaryFile() as fh:
                        stream, _ = api.get_archive(handle.container, area)
                        for chunk in stream:
                            fh.write(chunk)
                        self._scan(fh, values, area)
                        fh.seek(0)
                        # the tar is rooted at the area's own name
                        api.put_archive(helper, posixpath.dirname(area), fh)
                api.commit(helper, repository=SNAPSHOT_REPO, tag=snap_id,
                           message=f"corral snapshot of {handle.id}",
                           conf={"Labels": {LABEL: "1", "corral.snapshot": snap_id,
                                            "corral.source-sandbox": handle.id,
                                            "corral.snapshot-label": label}})
            finally:
                api.remove_container(helper, force=True)

        try:
            await anyio.to_thread.run_sync(work)
        except SecretInSnapshotError:
            raise
        except Exception as exc:
            raise self._p.translate(exc, handle.id) from None
        return SnapshotRef("docker", snap_id, label)

    async def restore(self, snapshot: SnapshotRef, spec: SandboxSpec | None = None) -> Handle:
        restored: Handle = await self._p.create(spec, image=f"{SNAPSHOT_REPO}:{snapshot.id}")
        return restored

    async def delete(self, snapshot: SnapshotRef) -> None:
        errors = docker_errors()

        def work() -> None:
            try:
                self._p.api.remove_image(f"{SNAPSHOT_REPO}:{snapshot.id}", force=True)
            except errors.ImageNotFound:
                pass

        try:
            await anyio.to_thread.run_sync(work)
        except Exception as exc:
            raise self._p.translate(exc, snapshot.id) from None

    async def exists(self, snapshot: SnapshotRef) -> bool:
        errors = docker_errors()

        def work() -> bool:
            try:
                self._p.api.inspect_image(f"{SNAPSHOT_REPO}:{snapshot.id}")
            except errors.ImageNotFound:
                return False
            return True

        try:
            return await anyio.to_thread.run_sync(work)
        except Exception as exc:
            raise self._p.translate(exc, snapshot.id) from None
