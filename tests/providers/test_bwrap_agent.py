"""The bubblewrap sandbox's agent (#32): how commands reach it, and the fallback.

The attacks on its channel are in tests/security/test_agent_channel.py; the provider kit
(tests/providers/test_bubblewrap_conformance.py) runs through it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.providers._bubblewrap import BubblewrapHandle, BubblewrapProvider
from corral.sandbox._contracts import ResourceLimits, SandboxSpec
from corral.testing import wait_until_async
from corral.testing._plugin import require
from tests.helpers import agent_resident, idle_spare

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("need_bwrap")]


@pytest.fixture
def provider(corral_home: Path) -> BubblewrapProvider:
    return BubblewrapProvider()


@pytest.fixture
async def sandbox(provider: BubblewrapProvider) -> AsyncIterator[BubblewrapHandle]:
    h = await provider.create()
    try:
        yield h
    finally:
        await provider.destroy(h.ref)


async def test_commands_go_through_one_agent_per_sandbox(
    provider: BubblewrapProvider, sandbox: BubblewrapHandle
) -> None:
    assert provider.command_path()[0] == "agent", provider.command_path()
    for _ in range(3):
        r = await sandbox.process.exec(["sh", "-c", "echo $$; cat /proc/1/comm"])
        assert r.ok and r.stdout == b"2\ncorral-agent\n", r  # its own pid namespace
    proc = await sandbox.process.spawn(["sleep", "30"])
    try:
        if sandbox.state.cgroups:
            assert len(agent_resident(sandbox.state.cgroups)) == 2  # one bwrap, one agent
    finally:
        await proc.kill()
        await proc.wait()
        await proc.aclose()


async def test_another_host_process_uses_the_same_agent(sandbox: BubblewrapHandle,
                                                        corral_home: Path) -> None:
    assert (await sandbox.process.exec(["true"])).ok
    before = agent_resident(sandbox.state.cgroups) if sandbox.state.cgroups else set()
    code = (
        "import anyio, json, sys\n"
        "from corral.providers._bubblewrap import BubblewrapProvider\n"
        "async def main():\n"
        "    p = BubblewrapProvider()\n"
        f"    h = await p.resume({sandbox.id!r})\n"
        "    r = await h.process.exec(['sh', '-c', 'echo from $CORRAL_SANDBOX_ID'])\n"
        "    print(json.dumps([r.exit_code, r.stdout.decode(), p.command_path()[0]]))\n"
        "anyio.run(main)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False,
                          env={"CORRAL_HOME": str(corral_home), "PATH": "/usr/bin:/bin",
                               "PYTHONPATH": str(Path(__file__).parents[2] / "src")})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [0, f"from {sandbox.id}\n", "agent"]
    if sandbox.state.cgroups:
        assert agent_resident(sandbox.state.cgroups) == before  # the same agent served it


async def test_the_agent_is_started_at_create(provider: BubblewrapProvider,
                                              sandbox: BubblewrapHandle) -> None:
    # Ahead of the first command (it comes up while the caller does other work).
    if sandbox.state.cgroups:
        await wait_until_async(lambda: len(agent_resident(sandbox.state.cgroups)) == 2,
                               "the agent to run")
    r = await sandbox.process.exec(["cat", "/proc/1/comm"])
    assert r.ok and r.stdout == b"corral-agent\n", r


async def test_an_agent_that_cannot_start_leaves_the_launcher_chain(
    provider: BubblewrapProvider, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # bwrap refuses the agent's sandbox (an option it does not know): the command runs
    # once, through the launcher chain, and corral says why from then on.
    monkeypatch.setattr(BubblewrapHandle, "_prestart_agent", lambda self: None)
    sandbox = await provider.create()
    try:
        await _refused(provider, sandbox)
    finally:
        await provider.destroy(sandbox.ref)


async def _refused(provider: BubblewrapProvider, sandbox: BubblewrapHandle) -> None:
    assert sandbox._agent_args is not None
    sandbox._agent_args = b"--no-such-option\0" + sandbox._agent_args
    r = await sandbox.process.exec(["sh", "-c", "echo ran >> /workspace/count; cat /proc/1/comm"])
    assert r.ok and r.stdout == b"corral-init\n", r
    how, why = provider.command_path()
    assert how == "launcher" and "did not start" in why and "no-such-option" in why, why
    assert (await sandbox.fs.read("count")) == b"ran\n"
    proc = await sandbox.process.spawn(["cat", "/proc/1/comm"])
    assert [c async for c in proc.stdout] == [b"corral-init\n"]
    assert (await proc.wait()).ok
    await proc.aclose()


async def test_the_agent_can_be_turned_off(corral_home: Path) -> None:
    provider = BubblewrapProvider(agent=False)
    assert provider.command_path() == ("launcher", "the agent is turned off (agent = false)")
    h = await provider.create()
    try:
        r = await h.process.exec(["cat", "/proc/1/comm"])
        assert r.ok and r.stdout == b"corral-init\n", r
    finally:
        await provider.destroy(h.ref)


def _comm(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def _spare_init(cg: list[str]) -> int:
    """The idle spare's init (its pid on the host)."""
    (pid,) = [p for p in idle_spare(cg) if _comm(p) == "corral-agent"]
    return pid


async def test_the_next_command_runs_in_the_warm_spare_and_a_dead_spare_is_replaced(
    sandbox: BubblewrapHandle, request: pytest.FixtureRequest
) -> None:
    cg = sandbox.state.cgroups
    require(request.config, bool(cg), "cgroups (to find the spare's processes)", "run as root")
    assert (await sandbox.process.exec(["true"])).ok
    await wait_until_async(lambda: len(idle_spare(cg)) == 2, "the agent's warm spare")
    spare = idle_spare(cg)
    # The next command is the spare's process, exec'd: no new init was made for it.
    proc = await sandbox.process.spawn(["sleep", "30"])
    try:
        await wait_until_async(lambda: any(_comm(p) == "sleep" for p in spare),
                               "the spare's process to become the command")
    finally:
        await proc.kill(signal.SIGKILL)
        await proc.wait()
        await proc.aclose()
    # A new spare; killed (as the sandbox's OOM killer might), the next command starts
    # cold, in its own namespace as ever, and a new spare follows.
    await wait_until_async(lambda: len(idle_spare(cg)) == 2 and not idle_spare(cg) & spare,
                           "a new warm spare")
    dead = idle_spare(cg)
    os.kill(_spare_init(cg), signal.SIGKILL)
    await wait_until_async(lambda: not idle_spare(cg) & dead, "the spare to be gone")
    for _ in range(2):
        r = await sandbox.process.exec(["sh", "-c", "echo $$; cat /proc/1/comm"])
        assert r.ok and r.stdout == b"2\ncorral-agent\n", r
    await wait_until_async(lambda: len(idle_spare(cg)) == 2 and not idle_spare(cg) & dead,
                           "a warm spare again")


async def test_a_command_too_large_for_the_spare_starts_cold_and_leaves_it_waiting(
    sandbox: BubblewrapHandle, request: pytest.FixtureRequest
) -> None:
    cg = sandbox.state.cgroups
    require(request.config, bool(cg), "cgroups (to find the spare's processes)", "run as root")
    assert (await sandbox.process.exec(["true"])).ok
    await wait_until_async(lambda: len(idle_spare(cg)) == 2, "the agent's warm spare")
    spare = idle_spare(cg)
    # Launch fields over the spare's pipe size (60000 bytes): a cold start.
    r = await sandbox.process.exec(["sh", "-c", 'printf %s "$BIG" | wc -c; echo $$'],
                                   env={"BIG": "x" * 70000})
    assert r.ok and r.stdout.split() == [b"70000", b"2"], r
    assert idle_spare(cg) == spare  # the same spare, still waiting


async def test_an_exec_collects_more_output_than_the_agent_holds_back(
    sandbox: BubblewrapHandle,
) -> None:
    # A run request's output is held until its status, at most 64 KiB at a time: more
    # goes out as it comes, in order, with stdin written as the command reads.
    data = os.urandom(200_000)
    r = await sandbox.process.exec(
        ["sh", "-c", "cat; head -c 3000000 /dev/zero; echo done >&2"], stdin=data)
    assert r.ok and r.stderr == b"done\n", r
    assert r.stdout[:200_000] == data and r.stdout[200_000:] == bytes(3_000_000)


async def test_a_spare_the_pids_limit_refuses_is_tried_again_once_nothing_runs(
    provider: BubblewrapProvider, request: pytest.FixtureRequest
) -> None:
    h = await provider.create(SandboxSpec(limits=ResourceLimits(pids=8)))
    try:
        cg = h.state.cgroups
        require(request.config, bool(cg), "cgroups (the pids limit)", "run as root")
        pids_dir = next(d for d in cg if "/pids/" in d)

        def refused() -> int:
            for line in Path(pids_dir, "pids.events").read_text().splitlines():
                if line.startswith("max "):
                    return int(line.split()[1])
            return 0

        assert (await h.process.exec(["true"])).ok
        await wait_until_async(lambda: len(idle_spare(cg)) == 2, "the warm spare")
        before = refused()
        # bwrap, the agent, the command's init, sh and three sleeps: no room left for the
        # next spare's two processes.
        proc = await h.process.spawn(["sh", "-c", "sleep 100 & sleep 100 & sleep 100 & wait"])
        try:
            await wait_until_async(lambda: refused() > before, "the next spare to be refused")
        finally:
            await proc.kill(signal.SIGKILL)
            await proc.wait()
            await proc.aclose()
        # Commands start cold meanwhile, and are not taken to have hit the limit.
        r = await h.process.exec(["sh", "-c", "echo $$"])
        assert r.ok and r.stdout == b"2\n" and r.limit_hit is None, r
        # Once nothing has run for a moment, a spare again; refused once, not retried in
        # a loop while the sleepers held the pids.
        await wait_until_async(lambda: len(idle_spare(cg)) == 2, "a warm spare again")
        assert refused() - before <= 2, refused() - before
    finally:
        await provider.destroy(h.ref)
