"""Two ``$CORRAL_HOME``s on one machine, one store, bubblewrap sandboxes (issue #26, 4):
whichever home finishes a run destroys its sandbox, although the sandbox lives under the
home that started it; and ``corral gc`` finds bubblewrap sandboxes of its own store whose
instance record is gone, in any home of the machine, and only those.

The sandbox's files and cgroups are found through corral's root-owned files index
(``$CORRAL_SHARED_DIR/bubblewrap``), never through a path a store row names: as root only
(sandboxes run as an unprivileged uid only then), which is how a multi-server host runs.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral.providers._bubblewrap import BubblewrapProvider
from corral.providers._state import SandboxState
from tests.corral_cli import CliHome
from tests.helpers import wait_until

pytestmark = [pytest.mark.usefixtures("need_bwrap_runs"),
              pytest.mark.skipif(os.geteuid() != 0, reason="cross-home reach needs root")]

# Prints a line, waits for the test's go-ahead (a file in the workspace), prints another.
SCRIPT = "echo one; while [ ! -e go ]; do sleep 0.05; done; echo two"


_made: list[tuple[Path, str]] = []


@pytest.fixture(autouse=True)
def _no_leak_on_failure() -> Any:
    """A failing test still destroys the sandboxes it made (from their own home)."""
    yield
    while _made:
        home, sandbox_id = _made.pop()
        anyio.run(BubblewrapProvider(home).destroy, sandbox_id)


def _hosts(tmp_path: Path, corral_cmd: list[str], cli_env: dict[str, str]
           ) -> tuple[CliHome, CliHome]:
    (tmp_path / "shared").mkdir()
    url = f"sqlite://{tmp_path / 'shared' / 'corral.db'}"
    made = []
    for name in ("a", "b"):
        home = tmp_path / f"home-{name}"
        home.mkdir()
        env = {**cli_env, "CORRAL_HOME": str(home), "CORRAL_STORE": url,
               "CORRAL_LEASE_TTL": "3"}
        host = CliHome(corral_cmd, env, home)
        host.db = tmp_path / "shared" / "corral.db"
        made.append(host)
    return made[0], made[1]


def _state(home: Path, sandbox_id: str) -> SandboxState | None:
    return SandboxState.load(home / "sandboxes" / "bubblewrap" / sandbox_id)


def _leftovers(state: SandboxState) -> list[str]:
    """What of the sandbox is still on the machine: its files dir and cgroups."""
    paths = [state.files_dir, *state.cgroups]
    return [p for p in paths if p and os.path.exists(p)]


def _go(home: Path, sandbox_id: str) -> None:
    async def go() -> None:
        handle = await BubblewrapProvider(home).resume(sandbox_id)
        assert handle is not None
        await handle.fs.write("go", b"")

    anyio.run(go)


def _start(a: CliHome, run_id: str) -> tuple[str, SandboxState]:
    out = a.run("run", "--provider", "bubblewrap", "--run-id", run_id, "--detach", "--",
                "sh", "-c", SCRIPT)
    assert out.returncode == 0, out.stderr
    record = a.raw(run_id)
    assert record is not None
    sandbox_id = record["sandbox_ref"]["id"]
    _made.append((a.home, sandbox_id))
    state = _state(a.home, sandbox_id)
    assert state is not None and _leftovers(state)
    return sandbox_id, state


def test_the_home_that_reaps_a_run_destroys_its_sandbox_in_the_home_that_started_it(
    tmp_path: Path, corral_cmd: list[str], cli_env: dict[str, str]
) -> None:
    a, b = _hosts(tmp_path, corral_cmd, cli_env)
    sandbox_id, state = _start(a, "x1")
    _go(a.home, sandbox_id)
    wait_until(lambda: "two" in (a.home / "journals" / "x1.journal").read_text(),
               "the agent to finish", timeout=60)

    def reaped() -> bool:
        out = b.run("reap", "--json")
        assert out.returncode == 0, out.stderr
        runs: list[dict[str, Any]] = json.loads(out.stdout)["runs"]
        return any(r["outcome"] == "finalized" for r in runs)

    wait_until(reaped, "home B to finalize the run", timeout=60)
    assert a.raw("x1")["status"] == "completed"  # type: ignore[index]
    assert _state(a.home, sandbox_id) is None, "the sandbox's state is left in home A"
    assert _leftovers(state) == [], "the sandbox's files or cgroups are left"


def test_the_home_that_cancels_a_run_destroys_its_sandbox_in_the_home_that_started_it(
    tmp_path: Path, corral_cmd: list[str], cli_env: dict[str, str]
) -> None:
    a, b = _hosts(tmp_path, corral_cmd, cli_env)
    sandbox_id, state = _start(a, "x2")
    out = b.run("cancel", "x2")
    assert out.returncode == 0, out.stderr
    assert a.raw("x2")["status"] == "aborted"  # type: ignore[index]
    assert _state(a.home, sandbox_id) is None
    assert _leftovers(state) == []


def test_gc_finds_a_bubblewrap_sandbox_whose_record_is_gone_in_any_home_of_its_store(
    tmp_path: Path, corral_cmd: list[str], cli_env: dict[str, str]
) -> None:
    a, b = _hosts(tmp_path, corral_cmd, cli_env)
    sandbox_id, state = _start(a, "x3")
    # Another store's sandbox on the same machine: never touched.
    (tmp_path / "other").mkdir()
    other = CliHome(corral_cmd, {**cli_env, "CORRAL_HOME": str(tmp_path / "other"),
                                 "CORRAL_STORE": f"sqlite://{tmp_path / 'other' / 'corral.db'}"},
                    tmp_path / "other")
    other_id, other_state = _start(other, "y3")
    try:
        _go(a.home, sandbox_id)
        wait_until(lambda: "two" in (a.home / "journals" / "x3.journal").read_text(),
                   "the agent to finish", timeout=60)
        # The record is gone (as an older corral's cross-home finish left it): an orphan.
        import sqlite3

        with sqlite3.connect(a.db) as conn:
            conn.execute("DELETE FROM instances")
        out = b.run("gc", "--json", "--orphan-grace", "0")
        assert out.returncode == 0, out.stderr
        entries = json.loads(out.stdout)["entries"]  # one document
        mine = [e for e in entries if e["sandbox"] == sandbox_id]
        assert [e["outcome"] for e in mine] == ["orphan-destroyed"], entries
        assert not [e for e in entries if e["sandbox"] == other_id], entries
        assert _state(a.home, sandbox_id) is None
        assert _leftovers(state) == []
        assert _state(other.home, other_id) is not None and _leftovers(other_state)
    finally:
        shutil.rmtree(other.home / "journals", ignore_errors=True)


def test_a_store_row_cannot_point_a_destroy_at_a_path(tmp_path: Path) -> None:
    """The id is all a record gives: a path, or an id of another home's named sandbox,
    reaches nothing outside this home."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "state.json").write_text("{}")
    provider = BubblewrapProvider(tmp_path / "home")
    for hostile in (str(victim), "../../victim", "/etc"):
        with pytest.raises(Exception, match="invalid sandbox id"):
            anyio.run(provider.destroy, hostile)
    assert (victim / "state.json").exists()
