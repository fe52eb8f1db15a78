"""Provider kit, commands in a sandbox: ``exec`` (exit codes, streams, stdin, environment,
timeouts) and spawned processes (streaming, kill, background processes)."""

from __future__ import annotations

import signal
import time

import anyio

from corral._errors import CorralError
from corral.sandbox._contracts import SandboxSpec
from corral.testing._kit import Kit, raises
from corral.testing._provider_case import (
    ProviderCase, assert_beating, assert_stopped, heartbeat_cmd, provider_case, second_process,
)

__all__ = ["PROCESS_CHECKS"]

PROCESS_CHECKS: Kit[ProviderCase] = Kit("provider", subject=provider_case)
"""This part's checks, in the order written (:data:`~corral.testing.PROVIDER_KIT` joins the
parts)."""


@PROCESS_CHECKS.add
async def check_exit_codes_and_streams_apart(case: ProviderCase) -> None:
    case.need_shell()
    sandbox = await case.sandbox()
    r = await sandbox.process.exec("echo out; echo err >&2; exit 7")
    assert (r.exit_code, r.stdout, r.stderr, r.signal, r.ok) == (7, b"out\n", b"err\n", None, False)
    ok = await sandbox.process.exec(["true"])
    assert ok.ok and ok.exit_code == 0


@PROCESS_CHECKS.add
async def check_signal_death_is_a_named_failure(case: ProviderCase) -> None:
    case.need_shell()
    sandbox = await case.sandbox()
    r = await sandbox.process.exec(["sh", "-c", "kill -TERM $$"])
    assert r.signal == signal.SIGTERM and r.signal_name == "SIGTERM"
    assert r.exit_code == 128 + signal.SIGTERM and not r.ok
    assert "SIGTERM" in r.describe()
    plain = await sandbox.process.exec(["sh", "-c", "exit 143"])
    assert plain.exit_code == 143 and plain.signal is None


@PROCESS_CHECKS.add
async def check_fifty_megabytes_of_output_do_not_deadlock(case: ProviderCase) -> None:
    case.need_shell()
    sandbox = await case.sandbox()
    r = await sandbox.process.exec(
        "head -c 20000000 /dev/zero >&2 & head -c 50000000 /dev/zero; wait", timeout=120
    )
    assert r.exit_code == 0
    assert len(r.stdout) == 50_000_000 and len(r.stderr) == 20_000_000


@PROCESS_CHECKS.add
async def check_stdin(case: ProviderCase) -> None:
    case.need_shell()
    sandbox = await case.sandbox()
    data = bytes(range(256)) * 4096
    r = await sandbox.process.exec(["cat"], stdin=data)
    assert r.stdout == data
    r2 = await sandbox.process.exec(["wc", "-c"], stdin=None)
    assert r2.stdout.strip() == b"0"


@PROCESS_CHECKS.add
async def check_env_and_cwd(case: ProviderCase) -> None:
    case.need_shell()
    provider = case.provider
    h = await provider.create(SandboxSpec(env={"FROM_SPEC": "spec value"}))
    try:
        await h.fs.mkdir("sub/dir")
        r = await h.process.exec(
            'printf "%s|%s|" "$FROM_SPEC" "$FROM_CALL"; pwd',
            env={"FROM_CALL": "call $value"},
            cwd="sub/dir",
        )
        assert r.ok, r
        spec_val, call_val, cwd = r.stdout.decode().strip().split("|")
        assert (spec_val, call_val) == ("spec value", "call $value")
        assert cwd.endswith("/workspace/sub/dir")
        default = await h.process.exec("pwd")
        assert default.stdout.decode().strip().endswith("/workspace")
    finally:
        await provider.destroy(h.ref)


@PROCESS_CHECKS.add
async def check_bad_requests_are_clear_errors(case: ProviderCase) -> None:
    sandbox = await case.sandbox()
    with raises(CorralError, match="does not exist"):
        await sandbox.process.exec("true", cwd="no/such/dir")
    with raises(CorralError):
        await sandbox.process.exec([])
    r = await sandbox.process.exec(["definitely-not-a-command-xyz"])
    assert r.exit_code == 127 and not r.ok


@PROCESS_CHECKS.add
async def check_timeout_kills_the_tree(case: ProviderCase) -> None:
    case.need_shell()
    provider = case.provider
    sandbox = await case.sandbox()
    cmd = f"setsid sh -c '{heartbeat_cmd('gc')}' >/dev/null 2>&1 & sleep 100"
    start = time.monotonic()
    r = await sandbox.process.exec(cmd, timeout=1.5)
    assert r.timed_out and not r.ok
    assert time.monotonic() - start < 30
    if provider.capabilities.killable_processes:
        await assert_stopped(sandbox, "gc")


@PROCESS_CHECKS.add
async def check_streaming_partial_lines_and_stdin(case: ProviderCase) -> None:
    case.need_shell()
    case.need("writable_stdin")
    sandbox = await case.sandbox()
    p = await sandbox.process.spawn(["sh", "-c", 'printf partial; printf E >&2; read x; printf "%s-done" "$x"'])
    it = p.stdout.__aiter__()
    got = b""
    with anyio.fail_after(10):
        while got != b"partial":
            got += await it.__anext__()
    err = await p.stderr.__aiter__().__anext__()
    assert err == b"E"
    await p.write_stdin(b"go\n")
    await p.close_stdin()
    rest = b"".join([chunk async for chunk in it])
    assert rest == b"go-done"
    r = await p.wait()
    assert r.exit_code == 0 and r.ok


@PROCESS_CHECKS.add
async def check_kill_reaches_grandchildren(case: ProviderCase) -> None:
    case.need_shell()
    provider = case.provider
    sandbox = await case.sandbox()
    script = f"setsid sh -c '{heartbeat_cmd('gc')}' >/dev/null 2>&1 & {heartbeat_cmd('parent')}"
    p = await sandbox.process.spawn(["sh", "-c", script])
    await assert_beating(sandbox, "gc")
    await assert_beating(sandbox, "parent")
    await p.kill()
    with anyio.fail_after(10):
        r = await p.wait()
    assert r.signal == signal.SIGKILL and not r.ok
    await assert_stopped(sandbox, "parent")
    if provider.capabilities.killable_processes:
        await assert_stopped(sandbox, "gc")


@PROCESS_CHECKS.add
async def check_kill_with_sigterm_lets_the_command_handle_it(case: ProviderCase) -> None:
    case.need_shell()
    sandbox = await case.sandbox()
    p = await sandbox.process.spawn(
        ["sh", "-c", "trap 'echo got-term; exit 3' TERM; echo ready; while :; do sleep 0.05; done"]
    )
    it = p.stdout.__aiter__()
    with anyio.fail_after(10):
        assert (await it.__anext__()).startswith(b"ready")
    await p.kill(signal.SIGTERM)
    with anyio.fail_after(10):
        r = await p.wait()
    assert r.exit_code == 3 and r.signal is None
    assert b"got-term" in b"".join([c async for c in it])


@PROCESS_CHECKS.add
async def check_background_process_outlives_its_creator(case: ProviderCase) -> None:
    case.need_shell()
    case.need("background_processes")
    sandbox = await case.sandbox()
    provider_factory = case.import_path
    res = second_process(provider_factory, "spawn", sandbox.id, heartbeat_cmd("bg"))
    assert res["resumed"] is True
    # The creator has exited; the process it started must still be running.
    await assert_beating(sandbox, "bg")
    await assert_beating(sandbox, "bg")
