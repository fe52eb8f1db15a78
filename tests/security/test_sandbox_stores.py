"""Attack: ``corral sandboxes ls/rm`` reach another store's sandboxes.

Two users (or two services) on one machine keep separate run stores; on docker they share
the daemon, on bubblewrap they may share a ``$CORRAL_HOME``. ``ls`` showed every corral
sandbox with no store or run, and ``rm`` destroyed a live run's sandbox of the other store
without a word. Each test makes its own run and touches only the sandbox that run made.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import one_line_refusal, wait_until


def run(argv: list[str], env: dict[str, str], timeout: float = 120
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


@pytest.fixture(params=["bubblewrap", "docker"])
def provider(request: pytest.FixtureRequest) -> str:
    request.getfixturevalue("need_docker" if request.param == "docker" else "need_bwrap_runs")
    return str(request.param)


def _rows(corral_cmd: list[str], env: dict[str, str], *extra: str) -> list[dict[str, Any]]:
    out = run([*corral_cmd, "sandboxes", "ls", "--json", *extra], env)
    assert out.returncode == 0, out.stderr
    rows: list[dict[str, Any]] = json.loads(out.stdout)  # one document: an array
    return rows


def test_another_store_cannot_list_or_remove_a_live_runs_sandbox(
    provider: str, corral_cmd: list[str], cli_env: dict[str, str], tmp_path: Path
) -> None:
    run_id = f"live-{tmp_path.name[-12:].replace('_', '-')}"
    # Store A runs; store B shares the CORRAL_HOME (bubblewrap's sandboxes live there) and,
    # on docker, the daemon.
    mine = {**cli_env, "CORRAL_STORE": f"sqlite:///{tmp_path / 'a.db'}"}
    theirs = {**cli_env, "CORRAL_STORE": f"sqlite:///{tmp_path / 'b.db'}"}
    started = run([*corral_cmd, "run", "--detach", "--provider", provider, "--run-id", run_id,
                   "--", "sleep", "600"], mine)
    assert started.returncode == 0, started.stderr
    sandbox: list[str] = []

    def made() -> bool:
        rows = [r for r in _rows(corral_cmd, mine, "--all-stores", "--provider", provider)
                if r["labels"].get("corral.run") == run_id]
        sandbox[:] = [r["id"] for r in rows]
        return bool(rows)

    try:
        wait_until(made, "the run's sandbox", timeout=120)
        (sid,) = sandbox
        # B does not see it by default; --all-stores shows whose it is.
        assert sid not in [r["id"] for r in _rows(corral_cmd, theirs)]
        (row,) = [r for r in _rows(corral_cmd, theirs, "--all-stores") if r["id"] == sid]
        assert row["run"] == run_id and row["this_store"] is False and row["store"]
        # B cannot remove it; nor can A while its run is running.
        for env, why in ((theirs, "another store"), (mine, "running")):
            refused = run([*corral_cmd, "sandboxes", "rm", "--provider", provider, sid], env)
            one_line_refusal(refused, sid, why, "--force")
        assert sid in [r["id"] for r in _rows(corral_cmd, mine, "--provider", provider)]
        status = run([*corral_cmd, "ls", "--json"], mine)
        assert [r["status"] for r in json.loads(status.stdout)] == ["running"], status.stdout
        # A's own listing names the store and the run.
        table = run([*corral_cmd, "sandboxes", "ls", "--provider", provider], mine).stdout
        header, *lines = table.splitlines()
        assert header.split()[:5] == ["ID", "PROVIDER", "CREATED", "STORE", "RUN"], header
        (line,) = [x for x in lines if x.startswith(sid)]
        assert "this" in line.split() and f"{run_id}" in line and "running" in line, line
        # --force is the user's explicit word.
        forced = run([*corral_cmd, "sandboxes", "rm", "--force", "--provider", provider, sid],
                     mine)
        assert forced.returncode == 0, forced.stderr
        assert sid not in [r["id"] for r in _rows(corral_cmd, mine, "--all-stores",
                                                   "--provider", provider)]
        sandbox.clear()
    finally:
        run([*corral_cmd, "cancel", run_id], mine)
        for sid in sandbox:  # only the sandbox this test's run made
            run([*corral_cmd, "sandboxes", "rm", "--force", "--provider", provider, sid], mine)


def test_an_empty_home_lists_no_sandbox_of_another_store(
    provider: str, corral_cmd: list[str], cli_env: dict[str, str], tmp_path: Path
) -> None:
    """``corral exec --keep`` in one home; an empty home lists nothing, and may not remove
    it without --force."""
    other_home = tmp_path / "empty-home"
    other_home.mkdir()
    empty = {**cli_env, "CORRAL_HOME": str(other_home)}
    kept = run([*corral_cmd, "exec", "--provider", provider, "--keep", "--", "true"], cli_env)
    assert kept.returncode == 0, kept.stderr
    sid = kept.stderr.strip().splitlines()[-1].split()[3]
    try:
        assert sid in [r["id"] for r in _rows(corral_cmd, cli_env, "--provider", provider)]
        assert sid not in [r["id"] for r in _rows(corral_cmd, empty, "--provider", provider)]
        if provider == "docker":  # the daemon is shared; bubblewrap's listing is per home
            refused = run([*corral_cmd, "sandboxes", "rm", "--provider", provider, sid], empty)
            one_line_refusal(refused, sid, "another store", "--force")
        mine = run([*corral_cmd, "sandboxes", "rm", "--provider", provider, sid], cli_env)
        assert mine.returncode == 0, mine.stderr
    finally:
        run([*corral_cmd, "sandboxes", "rm", "--force", "--provider", provider, sid], cli_env)
