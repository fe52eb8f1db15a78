"""A docker provider whose daemon does not answer fails with corral's one-line error, never
an SDK exception, on every path that talks to the daemon (no daemon needed here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.providers._docker import DockerProvider
from corral.providers._docker_client import DockerUnavailable
from corral.sandbox._contracts import SnapshotRef


@pytest.mark.anyio
@pytest.mark.parametrize("call", ["delete", "exists"])
async def test_snapshot_calls_on_a_dead_daemon_say_what_to_do(tmp_path: Path, call: str) -> None:
    provider = DockerProvider(docker_host=f"unix://{tmp_path}/no-daemon.sock")
    snaps = provider.snapshotter()
    ref = SnapshotRef("docker", "abc")
    with pytest.raises(DockerUnavailable) as err:
        if call == "delete":
            await snaps.delete(ref)
        else:
            await snaps.exists(ref)
    message = str(err.value)
    assert "\n" not in message and "start dockerd" in message
