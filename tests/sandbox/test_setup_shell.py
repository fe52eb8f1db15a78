"""run_setup: one shell per plan, per-step exit codes, timeouts and tails; forged markers."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.providers._bubblewrap import BubblewrapProvider
from corral.providers._local import LocalProvider
from corral.sandbox._contracts import Handle, Provider
from corral.sandbox._redact import Redactor
from corral.sandbox._setup_shell import SetupError, run_setup
from corral.sandbox._workspace import SetupItem, Step, parallel

pytestmark = [pytest.mark.anyio]


@pytest.fixture(params=["local", "bubblewrap"])
async def handle(request: pytest.FixtureRequest, corral_home: Path) -> AsyncIterator[Handle]:
    provider: Provider
    if request.param == "bubblewrap":
        request.getfixturevalue("bwrap_ok")
        provider = BubblewrapProvider()
    else:
        provider = LocalProvider()
    h = await provider.create()
    try:
        yield h
    finally:
        await provider.destroy(h.ref)


def steps(plan: list[str | SetupItem]) -> list[SetupItem]:
    return [Step(s) if isinstance(s, str) else s for s in plan]


async def setup(h: Handle, plan: list[str | SetupItem], env: dict[str, str] | None = None) -> None:
    await run_setup(h, steps(plan), env=env or {}, redactor=Redactor({}))


async def text(h: Handle, path: str) -> str:
    return (await h.fs.read(path)).decode()


class Counting:
    """A handle whose process API counts the programs the plan starts."""

    def __init__(self, handle: Handle) -> None:
        self.inner = handle.process
        self.handle = handle
        self.calls: list[str] = []

    @property
    def process(self) -> Counting:
        return self

    def __getattr__(self, name: str) -> object:
        return getattr(self.handle, name)

    async def exec(self, command, **kw):  # type: ignore[no-untyped-def]
        self.calls.append("exec")
        return await self.inner.exec(command, **kw)

    async def spawn(self, command, **kw):  # type: ignore[no-untyped-def]
        self.calls.append("spawn")
        return await self.inner.spawn(command, **kw)


async def test_serial_plan_is_one_shell_and_keeps_cd_and_export(handle: Handle) -> None:
    counting = Counting(handle)
    await setup(counting, ["mkdir -p a/b && cd a", "export X='two words'", "cd b",  # type: ignore[arg-type]
                           'echo "$X:$(basename "$PWD")" > ../../out'])
    assert counting.calls == ["spawn"]
    assert await text(handle, "out") == "two words:b\n"


async def test_a_step_that_exits_0_ends_only_itself(handle: Handle) -> None:
    # twice: the second `exit` runs in the shell the first one's EXIT trap started
    await setup(handle, ["mkdir -p d/e && cd d && export Y=1 && exit 0",
                         'cd e; [ -n "$Y" ] || exit 5; export Y="$Y-2"; exit 0',
                         'echo "$Y $(basename "$PWD")" > ../../out'])
    assert await text(handle, "out") == "1-2 e\n"


async def test_options_and_redirections_do_not_leak_into_the_next_step(handle: Handle) -> None:
    # A fresh shell per step used to drop these; the one shell resets them between steps.
    await setup(handle, ["set -eu; exec 2>/dev/null 1>/dev/null; IFS=:",
                         'false; echo "$UNSET_VAR_XYZ" > o; set -- a:b; for w in $*; do echo $w; done >> o'])
    assert await text(handle, "o") == "\na:b\n"


async def test_failing_step_has_its_own_exit_code_and_tail(handle: Handle) -> None:
    with pytest.raises(SetupError) as err:
        await setup(handle, ["echo from-step-one", "echo from-step-two; echo oops >&2; exit 7", "touch never"])
    assert err.value.step.startswith("echo from-step-two")
    assert err.value.how == "exit code 7"
    assert "from-step-two" in err.value.tail and "oops" in err.value.tail
    assert "from-step-one" not in err.value.tail
    assert not await handle.fs.exists("never")


async def test_set_e_failure_is_the_steps_exit_code(handle: Handle) -> None:
    with pytest.raises(SetupError) as err:
        await setup(handle, ["true", "set -e; echo before; sh -c 'exit 3'; echo after", "touch never"])
    assert err.value.how == "exit code 3"
    assert err.value.tail == "before"


async def test_each_step_has_its_own_timeout(handle: Handle) -> None:
    with pytest.raises(SetupError) as err:
        await setup(handle, [Step("sleep 0.3", timeout=30), Step("echo slow; sleep 30", timeout=0.5),
                             "touch never"])
    assert err.value.step == "echo slow; sleep 30"
    assert err.value.how == "timed out"
    assert err.value.tail == "slow"
    assert not await handle.fs.exists("never")


async def test_forged_markers_in_output_do_not_fake_exit_codes(handle: Handle) -> None:
    # A step's output is hostile: it prints what a record looks like (with guessed
    # nonces, every kind, on stdout and stderr) and then fails. The forgery must not end
    # the plan early, mark the failing step as passed or report another step's code.
    forge = "".join(
        f"printf '\\n%s:{rec}\\n' {n} {n} >&{fd}; "
        for rec in ("E:2:0", "E:3:0", "D", "S:3", "E:1:9")
        for n in ("0" * 32, "deadbeef" * 4, "x")
        for fd in (1, 2)
    )
    with pytest.raises(SetupError) as err:
        await setup(handle, ["true", forge + "exit 4", "touch never"])
    assert err.value.how == "exit code 4"
    assert err.value.step.endswith("exit 4")
    assert not await handle.fs.exists("never")
    # ... and a forged success record from a child writing to the records' channel
    # itself (an inherited fd) is ignored without the nonce.
    with pytest.raises(SetupError) as err:
        await setup(handle, ["sh -c \"printf '\\n%s:E:1:0\\n%s:D\\n' x x >&9\"; exit 6", "touch never"])
    assert err.value.how == "exit code 6"
    assert not await handle.fs.exists("never")


async def test_parallel_group_keeps_state_and_per_step_tails(handle: Handle) -> None:
    # each parallel step waits (with a deadline) for the other's file: serial would fail
    wait_for = "for i in $(seq 200); do [ -e {f} ] && exit 0; sleep 0.05; done; exit 9"
    await setup(handle, [
        "mkdir -p s && cd s && export G=g1",
        parallel('touch a; echo "$G $(basename "$PWD")" > pa; ' + wait_for.format(f="b"),
                 "touch b; " + wait_for.format(f="a")),
        'echo "$G $(basename "$PWD")" > after',
    ])
    assert await text(handle, "s/pa") == "g1 s\n"
    assert await text(handle, "s/after") == "g1 s\n"
    with pytest.raises(SetupError) as err:
        await setup(handle, [parallel("echo left; exit 3", "echo right; exit 4")])
    assert (err.value.how, err.value.tail) == ("exit code 3", "left")
    assert "also failed in the same parallel group: `echo right; exit 4`" in err.value.__notes__[0]


async def test_secrets_reach_steps_and_are_redacted_in_tails(handle: Handle) -> None:
    with pytest.raises(SetupError) as err:
        await run_setup(handle, steps(["true", 'echo "token=$TOK"; exit 1']), env={"TOK": "s3cr3t-value-123"},
                        redactor=Redactor({"TOK": "s3cr3t-value-123"}))
    assert "s3cr3t-value-123" not in str(err.value)


async def test_a_sandbox_without_bash_runs_the_plan_in_sh(corral_home: Path, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("env", "mkdir", "touch", "cat"):
        os.symlink(f"/usr/bin/{tool}" if Path(f"/usr/bin/{tool}").exists() else f"/bin/{tool}",
                   bin_dir / tool)
    provider = LocalProvider()
    h = await provider.create()
    try:
        await setup(h, ["mkdir d && cd d", "export Z=z; exit 0", 'echo "$Z" > here'],
                    env={"PATH": str(bin_dir)})
        assert await text(h, "d/here") == "z\n"
    finally:
        await provider.destroy(h.ref)


# ------------------------------------------------------------------ step markers


class _OneRegexOutput:
    """The marker cutter as it was: one pattern per nonce (the reference for the shared
    pattern the shell's output goes through now)."""

    def __init__(self, nonce: bytes) -> None:
        import re

        self._mark = re.compile(rb"\n" + re.escape(nonce) + rb":S:(\d+)\n")
        self.buf = bytearray()
        self.step = 0

    def feed(self, chunk: bytes) -> None:
        self.buf += chunk
        while (m := self._mark.search(self.buf)) is not None:
            self.step = int(m.group(1))
            del self.buf[: m.end()]


_NONCE = b"0123456789abcdef0123456789abcdef"
_pieces = st.sampled_from([
    b"\n" + _NONCE + b":S:1\n", b"\n" + _NONCE + b":S:22\n", b"\n" + _NONCE[:-1] + b":S:3\n",
    b"\nf" + _NONCE + b":S:4\n", b"\n" + _NONCE + b":S:x\n", b"\n" + _NONCE + b":S:",
    b"\n", b":S:", b"5\n", _NONCE, b"out", b"\nabc:S:6\n",
]) | st.binary(max_size=6)


@given(st.lists(_pieces, max_size=12), st.lists(st.integers(1, 9), min_size=1, max_size=12),
       st.sampled_from([_NONCE, b"n.o(nce"]))
def test_step_markers_are_cut_as_with_one_pattern_per_nonce(
        pieces: list[bytes], cuts: list[int], nonce: bytes) -> None:
    from corral.sandbox._setup_shell import _KEEP_BYTES, _Output

    stream = b"".join(p.replace(_NONCE, nonce) for p in pieces)
    new, old = _Output(nonce), _OneRegexOutput(nonce)
    at, i = 0, 0
    while at < len(stream):
        chunk = stream[at : at + cuts[i % len(cuts)]]
        at, i = at + len(chunk), i + 1
        new.feed(chunk)
        old.feed(chunk)
        assert new.step == old.step
    assert len(stream) > _KEEP_BYTES or new.of(new.step) == bytes(old.buf)
