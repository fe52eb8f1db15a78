"""A workspace checkpoint (#27) out of one docker container and restored into another (the
first deleted in between), on a SQLite store."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.providers._docker import DockerProvider
from corral.sandbox._checkpoint import checkpoint_workspace, restore_checkpoint
from corral.stores import SQLiteStore

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("corral_home", "need_docker")]

SETUP = ("mkdir -p src empty && printf 'print(1)\\n' > src/m.py && head -c 3000000 /dev/urandom"
         " > big.bin && printf '#!/bin/sh\\n' > run.sh && chmod 750 run.sh && ln -s src/m.py link"
         " && sha256sum big.bin src/m.py run.sh > /tmp/sums")
LIST = "find . -printf '%p %y %m %l\\n' | sort"


async def test_checkpoint_survives_its_container(tmp_path: Path) -> None:
    provider = DockerProvider()
    first = await provider.create()
    try:
        made = await first.process.exec(["sh", "-c", SETUP], cwd=first.workdir)
        assert made.ok, made
        listing = (await first.process.exec(["sh", "-c", LIST], cwd=first.workdir)).stdout
        sums = (await first.process.exec(["cat", "/tmp/sums"])).stdout
        async with SQLiteStore(tmp_path / "s.db") as store:
            cp = await checkpoint_workspace(first, store, thread_id="t", run_id="r1")
            assert cp is not None
            await provider.destroy(first.ref)
            second = await provider.create()
            try:
                await restore_checkpoint(second, store, cp.checkpoint_id)
                got = await second.process.exec(["sh", "-c", LIST], cwd=second.workdir)
                assert got.stdout == listing
                check = await second.process.exec(["sha256sum", "-c", "-"], stdin=sums,
                                                  cwd=second.workdir)
                assert check.ok, check
            finally:
                await provider.destroy(second.ref)
    finally:
        await provider.destroy(first.ref)
