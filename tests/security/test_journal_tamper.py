"""A journal that shrinks or changes under its reader ends the run with a clear error.

The agent holds no descriptor of the journal any more (see test_sandbox_boundary), so only
something outside corral can do this; the reader must still never hang or go on reading
from a position that no longer means anything.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest

from corral.journal._reader import JournalTamperedError, Line, read_journal
from corral.journal._layout import JournalPaths
from corral.journal._sentinel import new_nonce
from corral.journal._supervisor import AgentSpec, kill_supervised, launch_supervised

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
# Two lines, then silence until killed: the journal only changes when the test changes it.
AGENT = [sys.executable, "-c", "import time; print('one'); print('two', flush=True); time.sleep(300)"]


@pytest.fixture
def started(tmp_path: Path) -> Iterator[tuple[JournalPaths, str]]:
    paths = JournalPaths.for_run(tmp_path, "tampered")
    nonce = new_nonce()
    launch_supervised(AgentSpec(argv=AGENT, env=ENV), paths, nonce)
    yield paths, nonce
    kill_supervised(paths, grace=2.0, include_supervisor=True)


def _read_then(paths: JournalPaths, nonce: str, tamper: Callable[[Path], None]) -> list[bytes]:
    async def go() -> list[bytes]:
        seen: list[bytes] = []
        with anyio.fail_after(30):  # a hang is the bug: fail instead of waiting forever
            async for item in read_journal(paths, nonce=nonce, poll=0.05):
                assert isinstance(item, Line)
                seen.append(item.data)
                if len(seen) == 2:
                    tamper(paths.journal)
        return seen

    return anyio.run(go)


def test_truncated_journal_ends_the_reader(started: tuple[JournalPaths, str]) -> None:
    paths, nonce = started
    with pytest.raises(JournalTamperedError, match="truncated or rewrote"):
        _read_then(paths, nonce, lambda p: os.truncate(p, 0))


def test_journal_rewritten_before_the_offset_ends_the_reader(
    started: tuple[JournalPaths, str],
) -> None:
    paths, nonce = started

    def rewrite(p: Path) -> None:
        with open(p, "r+b") as f:  # same length, the last newline read is gone
            f.seek(len(b"one\ntwo"))
            f.write(b"X")

    with pytest.raises(JournalTamperedError):
        _read_then(paths, nonce, rewrite)
