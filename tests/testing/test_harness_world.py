"""The harness kit's world cleans up its own sandboxes, and only those."""

from __future__ import annotations

import pytest

from corral.providers._docker import DockerProvider
from corral.testing import HarnessCase
from corral.testing._harness_world import world

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("need_docker")]


async def test_a_docker_world_destroys_its_runs_sandboxes_and_no_one_elses() -> None:
    provider = DockerProvider()
    users = await provider.create()  # the user's sandbox on the same daemon
    try:
        async with world(lambda: HarnessCase("command", provider="docker")) as w:
            out = await w.acorral("run", "--provider", "docker", "--run-id", "w1", "--detach",
                                  "--", "sh", "-c", "sleep 300", timeout=120)
            assert out.returncode == 0, out.stderr
            ours = w.record("w1")["sandbox_ref"]["id"]
            assert await provider.resume(ours) is not None
        assert await provider.resume(ours) is None
        assert await provider.resume(users.id) is not None
    finally:
        await provider.destroy(users.ref)
