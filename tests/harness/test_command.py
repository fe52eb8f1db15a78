"""The command harness: real supervised programs, and properties of its translator."""

from __future__ import annotations

import base64
import os
import signal
import sys
import tempfile
from pathlib import Path

import anyio
import pytest
from ag_ui.core import EventType
from hypothesis import given, settings
from hypothesis import strategies as st

from corral._errors import ConfigError
from corral.harness._base import AgentRequest, Batch, Harness, RunContext, translate_run
from corral.harness._command import RAW_BYTES_EVENT, CommandHarness
from corral.harness._events import BaseEvent, event_to_dict
from corral.journal._reader import Line
from corral.journal._layout import JournalPaths
from corral.journal._sentinel import format_trailer, new_nonce
from corral.journal._supervisor import AgentSpec, kill_supervised, launch_supervised

CTX = RunContext(run_id="run-1", thread_id="thread-1")
NONCE = "c" * 32


def batches_of(harness: Harness, journal: object, nonce: str, **kw: object) -> list[Batch]:
    async def go() -> list[Batch]:
        with anyio.fail_after(30):
            return [b async for b in translate_run(harness, CTX, journal, nonce=nonce, **kw)]  # type: ignore[arg-type]

    return anyio.run(go)


def events(batches: list[Batch]) -> list[BaseEvent]:
    return [e for b in batches for e in b.events]


def deltas(evs: list[BaseEvent]) -> str:
    return "".join(e.delta for e in evs if e.type is EventType.TEXT_MESSAGE_CONTENT)  # type: ignore[attr-defined]


def rebuild_bytes(evs: list[BaseEvent]) -> bytes:
    """The documented lossless rule: raw-bytes events replace the next ``chars`` characters."""
    out = bytearray()
    skip = 0
    for e in evs:
        if e.type is EventType.CUSTOM and e.name == RAW_BYTES_EVENT:  # type: ignore[attr-defined]
            v = e.value  # type: ignore[attr-defined]
            out += (b"\n" if v["offset"] > 0 else b"") + base64.b64decode(v["base64"])
            skip = v["chars"]
        elif e.type is EventType.TEXT_MESSAGE_CONTENT:
            d: str = e.delta  # type: ignore[attr-defined]
            cut = min(skip, len(d))
            skip -= cut
            out += d[cut:].encode()
    return bytes(out)


# ---------------------------------------------------------------- real programs


@pytest.fixture
def run_command(tmp_path: Path):
    started: list[JournalPaths] = []

    def _run(argv: list[str], *, prompt: str | None = None) -> tuple[JournalPaths, str]:
        harness = CommandHarness(argv)
        cmd = harness.build_command(AgentRequest(prompt=prompt, workdir=str(tmp_path)))
        paths = JournalPaths.for_run(tmp_path / "state", f"r{len(started)}")
        nonce = new_nonce()
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        launch_supervised(AgentSpec(cmd.argv, env, cmd.cwd, cmd.stdin), paths, nonce)
        started.append(paths)
        return paths, nonce

    yield _run
    for paths in started:
        kill_supervised(paths, grace=2.0, include_supervisor=True)


def test_success_event_sequence(run_command) -> None:
    paths, nonce = run_command(["sh", "-c", "echo hello; echo; printf 'wörld'"])
    bs = batches_of(CommandHarness(), paths, nonce)
    evs = events(bs)
    kinds = [e.type for e in evs]
    assert kinds[:2] == [EventType.RUN_STARTED, EventType.TEXT_MESSAGE_START]
    assert kinds[-2:] == [EventType.TEXT_MESSAGE_END, EventType.RUN_FINISHED]
    assert set(kinds[2:-2]) == {EventType.TEXT_MESSAGE_CONTENT}
    assert deltas(evs) == "hello\n\nwörld"
    assert {e.message_id for e in evs if hasattr(e, "message_id")} == {"run-1-m0"}  # type: ignore[attr-defined]
    assert bs[0].journal_offset == 0 and bs[-1].exit is not None and bs[-1].exit.code == 0
    offsets = [b.journal_offset for b in bs]
    assert offsets == sorted(offsets)


def test_prompt_goes_to_stdin(run_command) -> None:
    paths, nonce = run_command(["cat"], prompt="the prompt")
    assert deltas(events(batches_of(CommandHarness(), paths, nonce))) == "the prompt"


def test_nonzero_exit_is_run_error_with_code_and_stderr_tail(run_command) -> None:
    noise = "x" * 5000
    paths, nonce = run_command(
        ["sh", "-c", f"echo out; echo {noise} >&2; echo 'the real reason' >&2; exit 3"])
    evs = events(batches_of(CommandHarness(), paths, nonce))
    last = event_to_dict(evs[-1])
    assert last["type"] == "RUN_ERROR" and last["code"] == "exit:3"
    assert last["message"].startswith("command exited with code 3: ")
    assert last["message"].endswith("the real reason")
    assert last["metadata"] == {"exitCode": 3, "signal": None}
    assert evs[-2].type is EventType.TEXT_MESSAGE_END and deltas(evs) == "out\n"


def test_signal_death_is_run_error(run_command) -> None:
    paths, nonce = run_command(["sh", "-c", "kill -TERM $$"])
    last = event_to_dict(events(batches_of(CommandHarness(), paths, nonce))[-1])
    assert last["type"] == "RUN_ERROR" and last["code"] == "signal:SIGTERM"
    assert "killed by SIGTERM (exit code 143)" in last["message"]


def test_each_line_is_delivered_while_the_program_still_runs(run_command) -> None:
    script = ("import signal,sys; signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1}); "
              "print('first line', flush=True); signal.sigwait({signal.SIGUSR1}); print('second')")
    paths, nonce = run_command([sys.executable, "-c", script])

    async def go() -> list[str]:
        seen: list[str] = []
        with anyio.fail_after(30):
            async for b in translate_run(CommandHarness(), CTX, paths, nonce=nonce):
                seen.append(deltas(b.events))
                if deltas(b.events) == "first line":
                    # The program is blocked until we signal it: this delta came from a live run.
                    from corral.journal._layout import read_status

                    st = read_status(paths.status)
                    assert st is not None and st.state == "running" and st.agent_pid
                    os.kill(st.agent_pid, signal.SIGUSR1)
        return seen

    assert anyio.run(go) == ["", "first line", "\nsecond", "\n", ""]


def test_bad_argv_is_a_config_error() -> None:
    for argv in (None, [], [""], ["a\0b"], "sh -c x"):
        with pytest.raises(ConfigError, match="argv"):
            CommandHarness(argv).build_command(AgentRequest())  # type: ignore[arg-type]
    cmd = CommandHarness().build_command(AgentRequest(options={"argv": ["echo", "x"]}))
    assert list(cmd.argv) == ["echo", "x"] and cmd.stdin is None
    assert isinstance(CommandHarness(), Harness)


def test_translator_is_finished_after_exit() -> None:
    t = CommandHarness().translator(CTX)
    t.start()
    from corral.journal._reader import Exit

    assert t.feed(Exit(0, None, 10)) and t.feed(Line(b"x", 12)) == []


# ---------------------------------------------------------------- properties


def journal_file(d: str, stdout: bytes, code: int) -> Path:
    p = Path(d) / "j"
    p.write_bytes(stdout + format_trailer(NONCE, code, None))
    return p


text_chunks = st.lists(st.one_of(st.text(max_size=30), st.just("\n"), st.just("")), max_size=20)


@settings(max_examples=80, deadline=None)
@given(chunks=text_chunks, code=st.sampled_from([0, 1, 255]), width=st.integers(1, 8))
def test_property_deltas_concatenate_to_stdout(chunks: list[str], code: int, width: int) -> None:
    stdout = "".join(chunks)
    with tempfile.TemporaryDirectory() as d:
        bs = batches_of(CommandHarness(max_delta_chars=width), journal_file(d, stdout.encode(), code),
                        NONCE, follow=False)
    evs = events(bs)
    assert deltas(evs) == stdout
    assert all(len(e.delta) <= width for e in evs if e.type is EventType.TEXT_MESSAGE_CONTENT)  # type: ignore[attr-defined]
    assert not any(e.type is EventType.CUSTOM for e in evs)
    assert evs[0].type is EventType.RUN_STARTED
    assert evs[-1].type is (EventType.RUN_FINISHED if code == 0 else EventType.RUN_ERROR)


@settings(max_examples=80, deadline=None)
@given(stdout=st.lists(st.one_of(st.binary(max_size=12), st.just(b"\n")), max_size=15).map(b"".join),
       width=st.integers(1, 6))
def test_property_arbitrary_bytes_are_lossless(stdout: bytes, width: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        evs = events(batches_of(CommandHarness(max_delta_chars=width), journal_file(d, stdout, 0),
                                NONCE, follow=False))
    assert rebuild_bytes(evs) == stdout
    assert deltas(evs) == stdout.decode("utf-8", "replace")


@settings(max_examples=60, deadline=None)
@given(stdout=st.lists(st.one_of(st.binary(max_size=12), st.text(max_size=12).map(str.encode),
                                 st.just(b"\n")), max_size=15).map(b"".join),
       code=st.sampled_from([0, 2]), data=st.data())
def test_property_resuming_from_any_logged_offset_gives_the_same_tail(
    stdout: bytes, code: int, data: st.DataObject
) -> None:
    harness = CommandHarness(max_delta_chars=5)
    with tempfile.TemporaryDirectory() as d:
        j = journal_file(d, stdout, code)
        full = batches_of(harness, j, NONCE, follow=False)
        k = data.draw(st.integers(0, len(full) - 1), label="last logged batch")
        resumed = batches_of(harness, j, NONCE, follow=False, after=full[k].journal_offset)
    wire = lambda bs: [(b.journal_offset, [event_to_dict(e) for e in b.events]) for b in bs]
    assert wire(resumed) == wire(full[k + 1 :])
