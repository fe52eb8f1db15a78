"""The provider kit against FakeProvider: it passes every check for what it claims, and the
checks about what it does not claim are named skips."""

from __future__ import annotations

import dataclasses

import anyio
import pytest

from corral.sandbox._contracts import ExecResult, UnsupportedCapability
from corral.testing import (
    PROVIDER_KIT,
    FakeCommand,
    FakeProvider,
    check_provider,
    pytest_checks,
    raises,
)

pytestmark = pytest.mark.anyio

pytest_checks(PROVIDER_KIT, FakeProvider, globals(), posix_shell=False)


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_the_kit_skips_exactly_what_the_fake_does_not_claim() -> None:
    report = await check_provider(FakeProvider, posix_shell=False)
    assert set(report.skipped) == {
        "exit_codes_and_streams_apart", "signal_death_is_a_named_failure",
        "fifty_megabytes_of_output_do_not_deadlock", "stdin", "env_and_cwd",
        "timeout_kills_the_tree", "streaming_partial_lines_and_stdin",
        "kill_reaches_grandchildren", "kill_with_sigterm_lets_the_command_handle_it",
        "background_process_outlives_its_creator", "fifos_planted_inside_never_block_the_host",
        "symlinks_planted_inside_cannot_reach_out", "resume_from_a_second_process",
        "host_command_from_a_detached_process", "host_command_processes_die_with_the_sandbox",
        "private_dir_is_invisible_inside", "agent_site_launches_probes_and_stops",
    }
    assert "names" in report.passed and "missing_capabilities_raise" in report.passed


async def test_a_handler_answers_commands_and_sees_the_files() -> None:
    seen: list[FakeCommand] = []

    async def answer(cmd: FakeCommand) -> ExecResult | None:
        seen.append(cmd)
        if cmd.argv[0] == "count":
            data = await cmd.fs.read(f"{cmd.cwd}/{cmd.argv[1]}")
            return ExecResult(0, str(len(data)).encode(), b"")
        return None

    provider = FakeProvider(answer)
    h = await provider.create()
    await h.fs.write("src/a.txt", b"hello")
    r = await h.process.exec(["count", "a.txt"], cwd="src", env={"X": "1"})
    assert (r.exit_code, r.stdout) == (0, b"5")
    assert (seen[0].cwd, seen[0].env) == ("/workspace/src", {"X": "1"})
    assert (await h.process.exec("echo built in")).stdout == b"built in\n"
    assert (await h.process.exec(["cat", "src/a.txt"])).stdout == b"hello"
    missing = await h.process.exec(["nope"])
    assert missing.exit_code == 127 and b"not found" in missing.stderr


async def test_shell_syntax_and_missing_capabilities_are_refused() -> None:
    provider = FakeProvider()
    h = await provider.create()
    with raises(UnsupportedCapability, match="shell"):
        await h.process.exec("echo a; echo b")
    p = await h.process.spawn(["echo", "hi"])
    assert b"".join([c async for c in p.stdout]) == b"hi\n"
    assert (await p.wait()).ok
    with raises(UnsupportedCapability, match="writable_stdin"):
        await p.write_stdin(b"x")
    with raises(UnsupportedCapability, match="host_processes"):
        _ = h.private_dir
    assert provider.capabilities == h.capabilities
    assert not any(dataclasses.asdict(provider.capabilities).values())  # claims nothing


async def test_a_slow_handler_times_out() -> None:
    async def slow(cmd: FakeCommand) -> ExecResult:
        await anyio.sleep(30)
        return ExecResult(0, b"", b"")

    h = await FakeProvider(slow).create()
    r = await h.process.exec(["x"], timeout=0.05)
    assert r.timed_out and not r.ok
