"""Where an aside event waits for the pipe: past the journal's last complete line."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from corral.runs._logged import LoggedOffset, complete_end

pytestmark = [pytest.mark.anyio]


@pytest.mark.parametrize(("data", "end"), [
    (b"", 0), (b"partial", 0), (b"a\n", 2), (b"a\nb", 2), (b"a\nbc\n", 5),
    # a line longer than the tail read (64 KiB): wait for the bytes before that tail
    (b"x\n" + b"y" * 70_000, 70_002 - 65_536),
])
def test_complete_end(tmp_path: Path, data: bytes, end: int) -> None:
    path = tmp_path / "journal"
    path.write_bytes(data)
    assert complete_end(path) == end
    assert complete_end(tmp_path / "none") == 0


async def test_a_waiter_wakes_when_the_pipe_gets_there() -> None:
    logged = LoggedOffset(10)
    assert await logged.wait(10, timeout=0.01)
    assert not await logged.wait(11, timeout=0.01)
    woke: list[bool] = []

    async def waiter() -> None:
        woke.append(await logged.wait(30, timeout=30))

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        logged.reached(20)
        await anyio.wait_all_tasks_blocked()
        assert woke == []
        logged.reached(5)  # never backwards
        assert logged.offset == 20
        logged.reached(31)
    assert woke == [True]
