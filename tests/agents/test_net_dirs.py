"""Socket directories of isolated sandboxes (bound at /run/corral for agent runs)."""

from __future__ import annotations

from pathlib import Path

import anyio

from corral.agents._prepare import NET_MOUNT, with_agent_binds
from corral.agents._installs import AGENTS_MOUNT
from corral._paths import net_root
from corral.providers._bubblewrap import BubblewrapProvider
from corral.sandbox._contracts import SandboxSpec



def test_a_sandbox_takes_its_socket_directory_with_it(bwrap: BubblewrapProvider) -> None:
    """The socket directory made for an isolated sandbox's agent runs is removed when the
    sandbox is destroyed; the agents install, bound the same way, is not touched."""

    async def main() -> tuple[Path, Path]:
        handle = await bwrap.create(with_agent_binds(SandboxSpec()))
        binds = dict((inside, Path(host)) for host, inside in handle.state.binds)
        net, agents = binds[NET_MOUNT], binds[AGENTS_MOUNT]
        assert net.is_dir() and net.parent == net_root()
        (net / "left-behind.sock").write_text("")  # what a crashed service would leave
        await bwrap.destroy(handle.ref)
        return net, agents

    net, agents = anyio.run(main)
    assert not net.exists()
    assert agents.exists()
