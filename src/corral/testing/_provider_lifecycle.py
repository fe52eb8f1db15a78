"""Provider kit, a sandbox's life: resumed from a second process, destroyed (its processes
and state with it), missing capabilities refused, names checked."""

from __future__ import annotations


import anyio

from corral._errors import CorralError
from corral.sandbox._contracts import SandboxGoneError, SandboxSpec, UnsupportedCapability
from corral.testing._kit import Kit, raises
from corral.testing._provider_case import ProviderCase, provider_case, second_process

__all__ = ["LIFECYCLE_CHECKS"]

LIFECYCLE_CHECKS: Kit[ProviderCase] = Kit("provider", subject=provider_case)
"""This part's checks, in the order written (:data:`~corral.testing.PROVIDER_KIT` joins the
parts)."""


@LIFECYCLE_CHECKS.add
async def check_resume_from_a_second_process(case: ProviderCase) -> None:
    case.need_shell()
    case.need("durable_filesystem")
    provider = case.provider
    provider_factory = case.import_path
    h = await provider.create()
    try:
        await h.fs.write("note.txt", b"written by the first process")
        res = second_process(provider_factory, "exec", h.id, "cat note.txt; echo more >> note.txt")
        assert res == {"resumed": True, "exit": 0, "out": "written by the first process"}
        assert await h.fs.read("note.txt") == b"written by the first processmore\n"
        again = await provider.resume(h.id)
        assert again is not None and again.id == h.id
        assert h.ref in await provider.list()
    finally:
        await provider.destroy(h.ref)
    assert second_process(provider_factory, "exec", h.id, "true") == {"resumed": False}


@LIFECYCLE_CHECKS.add
async def check_destroy_kills_processes_removes_state_and_is_idempotent(case: ProviderCase) -> None:
    provider = case.provider
    h = await provider.create()
    p = None
    if case.posix_shell:
        p = await h.process.spawn(["sh", "-c", "setsid sleep 1000 & exec sleep 1000"])
    await h.fs.write("keep.txt", b"x")
    await provider.destroy(h.ref)
    if p is not None:
        with anyio.fail_after(15):
            r = await p.wait()
            assert not r.ok
            # EOF on stdout means every holder of the pipe is dead, the setsid child too.
            rest = [c async for c in p.stdout]
        assert rest == []
    assert await provider.resume(h.ref) is None
    assert h.ref not in await provider.list()
    await provider.destroy(h.ref)  # again: no error
    await provider.destroy(h.id)
    with raises((SandboxGoneError, FileNotFoundError)):
        await h.process.exec("true")
    with raises(SandboxGoneError):
        await h.fs.read("keep.txt")


@LIFECYCLE_CHECKS.add
async def check_missing_capabilities_raise(case: ProviderCase) -> None:
    provider = case.provider
    sandbox = await case.sandbox()
    caps = provider.capabilities
    if not caps.snapshots:
        with raises(UnsupportedCapability):
            await provider.snapshot(sandbox, "x")
    if not caps.ports:
        with raises(UnsupportedCapability):
            await sandbox.connect_port(8080)
    if not caps.host_processes:
        with raises(UnsupportedCapability):
            sandbox.host_command("true")


@LIFECYCLE_CHECKS.add
async def check_names(case: ProviderCase) -> None:
    provider = case.provider
    h = await provider.create(SandboxSpec(name="named-sandbox.1"))
    try:
        assert h.id == "named-sandbox.1"
        with raises(CorralError, match="already exists"):
            await provider.create(SandboxSpec(name="named-sandbox.1"))
    finally:
        await provider.destroy(h.ref)
    for bad in ("../x", "a/b", "", "-x", "x" * 65):
        with raises(CorralError):
            await provider.create(SandboxSpec(name=bad))
