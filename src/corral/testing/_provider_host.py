"""Provider kit, the host side of a sandbox: host commands (from a detached process, dying
with the sandbox), the private directory the sandbox cannot see, and the agent's site
(launch, probe, stop)."""

from __future__ import annotations

import os
import signal
import subprocess

import anyio

from corral.journal._layout import JournalPaths
from corral.journal._sentinel import new_nonce
from corral.runs._placement import placement
from corral.runs._site import SupervisedCommand
from corral.sandbox._contracts import PathEscapeError
from corral.testing._kit import CheckSkipped, Kit, raises
from corral.testing._polling import wait_until_async
from corral.testing._provider_case import (
    ProviderCase, assert_beating, heartbeat_cmd, provider_case, start_host_command,
)

__all__ = ["HOST_CHECKS"]

HOST_CHECKS: Kit[ProviderCase] = Kit("provider", subject=provider_case)
"""This part's checks, in the order written (:data:`~corral.testing.PROVIDER_KIT` joins the
parts)."""


@HOST_CHECKS.add
async def check_host_command_from_a_detached_process(case: ProviderCase) -> None:
    case.need("host_processes")
    sandbox = await case.sandbox()
    private = sandbox.private_dir
    journal = os.path.join(private, "journal")
    hc = sandbox.host_command(
        "echo line1; echo to-stderr >&2; echo $MARK; exit 5", env={"MARK": "marked"}
    )
    with open(journal, "wb") as out, open(journal + ".err", "wb") as err:
        proc = start_host_command(hc, stdout=out, stderr=err)
    assert proc.wait(timeout=60) == 5
    with open(journal, "rb") as fh:
        assert fh.read() == b"line1\nmarked\n"
    with open(journal + ".err", "rb") as fh:
        assert fh.read() == b"to-stderr\n"


@HOST_CHECKS.add
async def check_host_command_processes_die_with_the_sandbox(case: ProviderCase) -> None:
    case.need("host_processes")
    provider = case.provider
    h = await provider.create()
    hc = h.host_command(f"setsid sh -c '{heartbeat_cmd('hb')}' & sleep 1000")
    proc = start_host_command(hc, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await assert_beating(h, "hb")
        await provider.destroy(h.ref)
        assert proc.wait(timeout=15) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        await provider.destroy(h.ref)


@HOST_CHECKS.add
async def check_private_dir_is_invisible_inside(case: ProviderCase) -> None:
    case.need("host_processes")
    provider = case.provider
    sandbox = await case.sandbox()
    private = sandbox.private_dir
    marker = "corral-private-" + os.urandom(6).hex()
    with open(os.path.join(private, marker), "w") as fh:
        fh.write("nonce")
    with raises((PathEscapeError, FileNotFoundError)):
        # A host path is read as a sandbox path: refused, or absent in the sandbox.
        await sandbox.fs.read(os.path.join(private, marker))
    if not provider.capabilities.isolated:
        return  # without isolation the guarantee cannot hold; corral says so
    found = await sandbox.process.exec(f"find / -name '{marker}' 2>/dev/null; true")
    assert found.stdout == b""
    cat = await sandbox.process.exec(["cat", os.path.join(private, marker)])
    assert not cat.ok and b"nonce" not in cat.stdout


@HOST_CHECKS.add
async def check_agent_site_launches_probes_and_stops(case: ProviderCase) -> None:
    """Where the provider's durable runs put their supervisor (its agent site,
    :mod:`corral.runs._placement`: on this host, or inside the sandbox) works: a supervised
    command is launched with its secret redacted from the journal, probed running, stopped,
    and probed finished with its signal's exit code."""
    case.need_shell()
    site_kind = placement(case.provider.capabilities)
    if site_kind is None:
        raise CheckSkipped("the provider declares neither host_processes nor "
                           "supervisor_inside: it hosts no supervised agent")
    sandbox = await case.sandbox()
    paths = JournalPaths.for_run(case.scratch / "journals", "kit-site-run")
    site = site_kind.started(sandbox, "kit-site-run", paths, new_nonce(),
                             lambda _name: case.provider)
    secret = "kit-secret-" + os.urandom(8).hex()
    pid = await site.launch(SupervisedCommand(
        ["sh", "-c", 'echo "started $KIT_SECRET"; exec sleep 600'],
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "KIT_SECRET": secret},
        redact={secret: "KIT_SECRET"}))
    assert pid > 0
    try:
        async def started() -> bool:
            await site.refresh()
            return paths.journal.exists() and b"started" in paths.journal.read_bytes()

        await wait_until_async(started, "the command's first line in the journal", timeout=60)
        assert (await site.probe()).state == "producing"
        await site.stop(1.0)

        async def exited() -> bool:
            return (await site.probe()).state == "finished"

        await wait_until_async(exited, "the probe to see the command's exit", timeout=30)
        probe = await site.probe()
        assert probe.exit_code == 128 + signal.SIGTERM, probe
        journal = paths.journal.read_bytes()
        assert secret.encode() not in journal and b"started [REDACTED:KIT_SECRET]" in journal
    finally:
        with anyio.CancelScope(shield=True):
            await site.stop(0.5, supervisor=True)
