"""The host's mirror of an inside-the-sandbox journal (:mod:`corral.runs._sandbox_site`) when two
processes of one host copy it at once: a driver's mirror loop and a probe (reaper sweep,
``corral show``) both call ``refresh_mirror`` on the same files."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import anyio
import pytest

from corral.journal._layout import encode_run_id
from corral.runs._sandbox_site import mirror_paths, refresh_mirror

JOURNAL = b"".join(b"line %d\n" % i for i in range(50))


class _Sandbox:
    """A supervisor whose journal reads all start before any returns (the race)."""

    def __init__(self, readers: int) -> None:
        self._readers = readers
        self._started = 0
        self._all_started = anyio.Event()

    async def read_journal(self, run: str, name: str, offset: int,
                           limit: int = 4 << 20) -> bytes | None:
        if name != "journal":
            return None
        self._started += 1
        if self._started >= self._readers:
            self._all_started.set()
        await self._all_started.wait()
        return JOURNAL[offset:offset + limit]

    async def supervisor_status(self, run: str) -> dict[str, Any]:
        return {"state": "exited"}


@pytest.mark.anyio
async def test_two_concurrent_refreshes_leave_the_mirror_equal_to_the_journal(
        tmp_path: Path) -> None:
    run_id = "run-mirror-1"
    paths = mirror_paths(run_id, tmp_path / "journals")
    sandbox = _Sandbox(readers=2)
    async with anyio.create_task_group() as tg:
        for _ in range(2):
            tg.start_soon(refresh_mirror, encode_run_id(run_id), paths, cast(Any, sandbox))
    assert paths.journal.read_bytes() == JOURNAL
