"""Attacks on the isolated providers' sandboxes (bubblewrap and docker). Each must fail, and
the failure is checked. Checks of one provider's machinery (bubblewrap's cgroups, rlimits and
host commands) skip on the other, saying so."""

# ruff: noqa: ASYNC220

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest

from corral.testing._plugin import require
from corral.providers import _cgroups as cgroups
from corral.providers._bubblewrap import BubblewrapHandle, BubblewrapProvider
from corral.providers._docker import DockerProvider
from corral.sandbox._contracts import HostCommand, ResourceLimits, SandboxSpec
from corral.testing._provider_case import start_host_command
from corral.testing import wait_until_async
from tests.helpers import agent_resident, idle_spare

pytestmark = pytest.mark.anyio

CHECKOUT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["bubblewrap", "docker"])
def provider(request: pytest.FixtureRequest, corral_home: Path) -> BubblewrapProvider:
    if request.param == "docker":
        request.getfixturevalue("need_docker")
        return DockerProvider()  # type: ignore[return-value]
    request.getfixturevalue("need_bwrap")
    return BubblewrapProvider()


def bwrap_only(provider: object, why: str) -> None:
    """Skip a check of bubblewrap's own machinery on another provider."""
    if not isinstance(provider, BubblewrapProvider | BubblewrapHandle):
        pytest.skip(f"bubblewrap-specific: {why}")


@pytest.fixture
async def sandbox(provider: BubblewrapProvider) -> AsyncIterator[BubblewrapHandle]:
    h = await provider.create()
    try:
        yield h
    finally:
        await provider.destroy(h.ref)


async def test_host_files_outside_the_sandbox_are_invisible(sandbox: BubblewrapHandle) -> None:
    targets = [str(CHECKOUT / "pyproject.toml"), "/root", os.environ["CORRAL_HOME"],
               "/etc/shadow", "/run/corral", "/run/corral-private"]
    if isinstance(sandbox, BubblewrapHandle):
        targets += [sandbox.private_dir, sandbox.state_dir]
    for target in targets:
        r = await sandbox.process.exec(["sh", "-c", 'ls -la "$1" && cat "$1"', "sh", target])
        assert not r.ok, f"{target} is readable inside the sandbox: {r.stdout[:200]!r}"
    # The system itself is there (read-only) so that tools work.
    assert (await sandbox.process.exec(["test", "-r", "/etc/os-release"])).ok
    assert (await sandbox.process.exec(["cat", "/etc/shadow"])).stderr.find(b"ermission") >= 0


async def test_no_connection_to_a_host_loopback_listener(sandbox: BubblewrapHandle) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    accepted: list[object] = []

    def accept() -> None:
        server.settimeout(5)
        try:
            accepted.append(server.accept())
        except OSError:
            pass

    t = threading.Thread(target=accept)
    t.start()
    try:
        # Prove the listener works from the host first, so that the failure below means
        # isolation and not a dead listener.
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        t.join(6)
        assert accepted, "host listener did not accept a host connection"
        accepted.clear()
        code = (
            "import socket,sys\n"
            f"try:\n socket.create_connection(('127.0.0.1',{port}),timeout=3); print('CONNECTED')\n"
            "except OSError as e: print('refused', e)\n"
        )
        r = await sandbox.process.exec(["python3", "-c", code], timeout=30)
        assert b"CONNECTED" not in r.stdout and b"refused" in r.stdout, r
    finally:
        server.close()


async def test_no_name_resolution_and_no_interfaces(sandbox: BubblewrapHandle) -> None:
    code = (
        "import socket\n"
        "try: print(socket.getaddrinfo('pypi.org', 443)); print('RESOLVED')\n"
        "except OSError as e: print('no dns', e)\n"
    )
    r = await sandbox.process.exec(["python3", "-c", code], timeout=30)
    assert b"RESOLVED" not in r.stdout and b"no dns" in r.stdout, r
    links = await sandbox.process.exec(["cat", "/proc/net/dev"])
    names = {line.split(b":")[0].strip() for line in links.stdout.splitlines()[2:]}
    assert names == {b"lo"}, names


async def test_host_processes_are_invisible(sandbox: BubblewrapHandle) -> None:
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        r = await sandbox.process.exec(
            "for p in /proc/[0-9]*; do cat $p/cmdline 2>/dev/null | tr '\\0' ' '; echo; done"
        )
        assert r.ok
        seen = r.stdout.decode()
        assert "sleep 300" not in seen and "pytest" not in seen
        for pid in (os.getpid(), sleeper.pid):
            probe = await sandbox.process.exec(["kill", "-0", str(pid)])
            assert not probe.ok, (pid, probe)
        assert sleeper.poll() is None  # and nothing happened to it
    finally:
        sleeper.kill()
        sleeper.wait()


async def test_the_system_is_read_only(sandbox: BubblewrapHandle) -> None:
    for target in ("/usr/corral-pwned", "/etc/corral-pwned", "/usr/bin/corral-pwned", "/corral-pwned"):
        r = await sandbox.process.exec(["sh", "-c", 'echo x > "$1"', "sh", target])
        assert not r.ok
        assert not os.path.exists(target)
    r = await sandbox.process.exec(["sh", "-c", "echo x >> /etc/passwd"])
    assert not r.ok
    who = await sandbox.process.exec(["id", "-u"])
    assert who.stdout.strip() == b"1000"


async def test_runs_unprivileged_and_cannot_nest_user_namespaces(sandbox: BubblewrapHandle) -> None:
    caps = await sandbox.process.exec(["grep", "Cap", "/proc/self/status"])
    for line in caps.stdout.decode().splitlines():
        if line.startswith(("CapEff", "CapPrm")):
            assert int(line.split()[1], 16) == 0, line
    nest = await sandbox.process.exec(["unshare", "-U", "true"])
    assert not nest.ok


async def test_exec_leaves_nothing_running(sandbox: BubblewrapHandle) -> None:
    start = anyio.current_time()
    r = await sandbox.process.exec("setsid sleep 60 & sleep 60 & echo started", timeout=30)
    assert r.ok and r.stdout == b"started\n" and not r.timed_out
    assert anyio.current_time() - start < 10
    if not isinstance(sandbox, BubblewrapHandle):
        # A command's background processes end with it (its exec's tree is killed).
        async def no_sleepers() -> bool:
            ps = await sandbox.process.exec("cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
            return b"sleep 60" not in ps.stdout
        await wait_until_async(no_sleepers, "the command's sleepers to end", interval=0.1)
        return
    # Nothing but the sandbox's agent (its bwrap and itself, its idle spare) stays.
    cg = sandbox.state.cgroups
    await wait_until_async(lambda: cgroups.members(cg) <= agent_resident(cg) | idle_spare(cg),
                           "the sandbox's cgroups to hold nothing but its agent", interval=0.02)


async def test_every_process_of_a_command_is_born_in_the_sandboxs_cgroups(
    sandbox: BubblewrapHandle, request: pytest.FixtureRequest
) -> None:
    bwrap_only(sandbox, "the sandbox's own cgroups")
    need_cgroups(request)
    # The cgroup namespace is made when bwrap forks the init: its root being the sandbox's
    # own group proves bwrap was already in it then (joining later would show a path).
    r = await sandbox.process.exec(["cat", "/proc/self/cgroup"])
    seen = {line.split(":")[1]: line.split(":", 2)[2] for line in r.stdout.decode().splitlines()}
    assert [seen.get(c) for c in ("memory", "pids", "freezer")] == ["/", "/", "/"], seen
    proc = await sandbox.process.spawn(["sleep", "60"])
    try:
        # bwrap, the init and the command, each in every one of the sandbox's groups (until
        # the init's child has exec'd ``sleep`` it is a second ``corral-init``: wait for it).
        def names() -> list[str]:
            # A process may end between the listing and the read (the previous command's
            # init finishes after reporting its status): it is simply not there.
            found = []
            for pid in cgroups.members(sandbox.state.cgroups):
                with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                    found.append(Path(f"/proc/{pid}/comm").read_text().strip())
            return sorted(found)

        # Through the agent: its bwrap, the agent, the command's init (a fork of the
        # agent) and the command, and the warm spare (the next command's init and its
        # process, waiting); else bwrap, corral's init and the command.
        want = (["bwrap", *["corral-agent"] * 3, "corral-spare", "sleep"]
                if sandbox._provider.command_path()[0] == "agent"
                else ["bwrap", "corral-init", "sleep"])
        await wait_until_async(lambda: names() == want,
                               "bwrap, the init and sleep in the cgroups", interval=0.02)
        groups = [cgroups.members([d]) for d in sandbox.state.cgroups]
        assert all(g == groups[0] for g in groups), groups
    finally:
        await proc.kill(signal.SIGKILL)
        await proc.wait()
        await proc.aclose()


async def test_the_command_holds_no_host_descriptor_and_gains_no_privileges(
    sandbox: BubblewrapHandle,
) -> None:
    r = await sandbox.process.exec(["sh", "-c", "ls /proc/$$/fd; cat /proc/self/status"])
    assert r.ok, r
    lines = r.stdout.decode().splitlines()
    assert lines[:3] == ["0", "1", "2"] and lines[3].startswith("Name:"), lines[:4]
    status = dict(line.split(":", 1) for line in lines[3:])
    assert status["NoNewPrivs"].strip() == "1"
    assert status["Groups"].split() == []  # none of corral's supplementary groups


async def test_without_cgroups_rlimits_apply_to_the_command(
    provider: BubblewrapProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    bwrap_only(provider, "rlimits when cgroups are missing")
    monkeypatch.setattr(cgroups, "available", lambda: (False, "no cgroups in this test"))
    h = await provider.create(SandboxSpec(limits=ResourceLimits(memory_bytes=256 << 20, pids=100)))
    try:
        assert h.state.limit_mode == "rlimit"
        r = await h.process.exec(["cat", "/proc/self/limits"])
        # "%-25s %-20s %-20s %-10s": the name, the soft and the hard limit, the unit.
        rows = {line[:26].strip(): line[26:].split()[:2] for line in r.stdout.decode().splitlines()}
        assert rows["Max address space"] == [str(256 << 20)] * 2, rows
        assert rows["Max processes"] == ["100", "100"], rows
    finally:
        await provider.destroy(h.ref)


async def test_fork_bomb_is_stopped_by_the_pids_limit(provider: BubblewrapProvider,
                                                     request: pytest.FixtureRequest) -> None:
    bwrap = isinstance(provider, BubblewrapProvider)
    if bwrap:
        need_cgroups(request)
    h = await provider.create(SandboxSpec(limits=ResourceLimits(pids=40)))
    try:
        # Bounded: at most 200 attempts, each a sleeper that would live 30 s (they are
        # killed when the command ends, so this returns at once).
        r = await h.process.exec(
            "i=0; while [ $i -lt 200 ]; do sleep 30 & i=$((i+1)); done; echo spawned-all",
            timeout=60,
        )
        assert r.limit_hit == "pids", r
        assert "pids limit was reached" in r.describe()  # not only "sh: Cannot fork"
        assert b"fork" in r.stderr.lower(), r.stderr[-300:]  # the shell saw refused forks
        if not bwrap:
            after = await h.process.exec(["true"])
            assert after.ok and after.limit_hit is None
            return
        # The sandbox never held more than its limit, and nothing of it is left running.
        pids_dir = next(d for d in h.state.cgroups if "/pids/" in d)
        assert int(Path(pids_dir, "pids.peak").read_text()) <= 40
        # killed members can take a moment to be released
        await wait_until_async(lambda: cgroups.members([pids_dir])
                               <= agent_resident([pids_dir]) | idle_spare([pids_dir]),
                               "the pids cgroup to hold nothing but the agent", interval=0.02)
        after = await h.process.exec(["true"])
        assert after.ok and after.limit_hit is None
    finally:
        await provider.destroy(h.ref)


async def test_memory_limit_is_enforced_and_reported(provider: BubblewrapProvider,
                                                    request: pytest.FixtureRequest) -> None:
    if isinstance(provider, BubblewrapProvider):
        need_cgroups(request)
    h = await provider.create(SandboxSpec(limits=ResourceLimits(memory_bytes=64 << 20)))
    try:
        r = await h.process.exec(["python3", "-c", "x = b'\\x01' * (400 << 20); print('survived')"],
                                 timeout=60)
        assert b"survived" not in r.stdout
        assert r.signal == signal.SIGKILL and r.limit_hit == "memory", r
        assert "memory limit" in r.describe()
        small = await h.process.exec(["python3", "-c", "x = b'\\x01' * (8 << 20); print('ok')"])
        assert small.ok and small.limit_hit is None
    finally:
        await provider.destroy(h.ref)


async def test_cpu_limit_throttles(provider: BubblewrapProvider,
                                  request: pytest.FixtureRequest) -> None:
    bwrap_only(provider, "reads the cgroup's cpu.stat from the host")
    need_cgroups(request)
    h = await provider.create(SandboxSpec(limits=ResourceLimits(cpus=0.2)))
    try:
        cpu_dir = next(d for d in h.state.cgroups if "/cpu/" in d)
        assert Path(cpu_dir, "cpu.cfs_quota_us").read_text().strip() == "20000"
        def throttled() -> int:
            stat = dict(line.split() for line in
                        Path(cpu_dir, "cpu.stat").read_text().splitlines())
            return int(stat["nr_throttled"])

        # Four busy loops, a second at a time, until the quota bites: on a loaded machine
        # one loop's fair share of the CPU can stay under 20% and never reach the quota.
        for _ in range(20):
            r = await h.process.exec(
                "for i in 1 2 3 4; do timeout 1 sh -c 'while :; do :; done' & done; wait; true",
                timeout=30)
            assert r.ok
            if throttled() > 0:
                break
        assert throttled() > 0
    finally:
        await provider.destroy(h.ref)


def _launcher_group_kill(hc: HostCommand) -> Iterator[subprocess.Popen[bytes]]:
    proc = start_host_command(hc, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


async def test_killing_a_host_command_launcher_kills_its_sandboxed_tree(
    sandbox: BubblewrapHandle,
) -> None:
    bwrap_only(sandbox, "host commands (docker has no host_processes)")
    from corral.testing._provider_case import assert_beating, assert_stopped, heartbeat_cmd

    hc = sandbox.host_command(f"setsid sh -c '{heartbeat_cmd('hb')}' & sleep 1000")
    gen = _launcher_group_kill(hc)
    proc = next(gen)
    try:
        await assert_beating(sandbox, "hb")
        os.killpg(proc.pid, signal.SIGTERM)
        await wait_until_async(lambda: proc.poll() is not None, "the host command to exit",
                               interval=0.02)
        await assert_stopped(sandbox, "hb")
    finally:
        for _ in gen:
            pass


async def test_destroy_frees_cgroups_and_files(provider: BubblewrapProvider) -> None:
    bwrap_only(provider, "host cgroups and files")
    h = await provider.create()
    dirs = list(h.state.cgroups)
    files = h.host_root
    await provider.destroy(h.ref)
    assert not any(os.path.exists(d) for d in dirs)
    assert not os.path.exists(files) and not os.path.exists(h.state_dir)



async def test_prune_orphans_after_corral_home_is_deleted(
    provider: BubblewrapProvider, corral_home: Path
) -> None:
    bwrap_only(provider, "host state directories")
    import shutil

    h = await provider.create()
    p = await h.process.spawn(["sleep", "1000"])
    files, dirs = h.host_root, list(h.state.cgroups)
    shutil.rmtree(h.state_dir)  # as if $CORRAL_HOME were deleted under a live sandbox
    keep = await provider.create()  # a healthy sandbox must survive the prune
    try:
        pruned = await provider.prune_orphans()
        assert str(Path(files).parent) in pruned
        assert not os.path.exists(files) and not any(os.path.exists(d) for d in dirs)
        with anyio.fail_after(10):
            assert (await p.wait()).signal == signal.SIGKILL
        assert (await keep.process.exec(["true"])).ok
    finally:
        await provider.destroy(keep.ref)


def need_cgroups(request: pytest.FixtureRequest) -> None:
    ok, why = cgroups.available()
    require(request.config, ok, f"cgroups ({why})",
            "run where a cgroup v1 memory/pids/cpu hierarchy is writable")
