"""``corral reap`` end to end: real bubblewrap sandboxes, real SQLite, real processes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral._durations import parse_duration
from corral._errors import ConfigError
from corral.journal._layout import JournalPaths, read_status
from corral.journal._supervisor import supervisor_alive
from tests.corral_cli import CliHome
from tests.helpers import wait_until


# ------------------------------------------------------------------ durations


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("5m", 300), ("1h", 3600), ("2d", 172800), ("500ms", 0.5), ("1h30m", 5400),
     ("0s", 0), ("45", 45), ("1.5h", 5400), (" 10M ", 600)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "s", "5x", "-5s", "1h-", "h1", "5 s", "1e3s", "nan",
                                  "inf", "1.s", "99999999999d"])
def test_bad_durations_name_the_value(text: str) -> None:
    with pytest.raises(ConfigError, match="invalid --ttl") as caught:
        parse_duration(text, what="--ttl")
    assert repr(text) in str(caught.value)


@given(st.lists(st.tuples(st.integers(0, 900), st.sampled_from(["ms", "s", "m", "h", "d"])),
                min_size=1, max_size=4))
def test_duration_parts_add_up(parts: list[tuple[int, str]]) -> None:
    unit = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    text = "".join(f"{n}{u}" for n, u in parts)
    assert parse_duration(text) == pytest.approx(sum(n * unit[u] for n, u in parts))


@given(st.text(max_size=12))
def test_any_text_parses_or_is_a_config_error(text: str) -> None:
    try:
        assert parse_duration(text) >= 0
    except ConfigError:
        pass


# ------------------------------------------------------------------ end to end


class Cli(CliHome):
    def start(self, run_id: str, script: str) -> JournalPaths:
        out = self.run("run", "--detach", "--run-id", run_id, "--", "sh", "-c", script)
        assert out.returncode == 0, out.stderr
        return JournalPaths.for_run(self.home / "journals", run_id)

    def sandbox_exists(self, run_id: str) -> bool:
        record = self.raw(run_id)
        assert record is not None
        ref = record["sandbox_ref"]
        return (self.home / "sandboxes" / ref["provider"] / ref["id"]).exists()


def exited(paths: JournalPaths) -> bool:
    st = read_status(paths.status)
    return st is not None and st.state == "exited"


@pytest.fixture
def cli(corral_cmd: list[str], cli_env: dict[str, str], corral_home: Path,
        need_bwrap_runs: None) -> Cli:
    cli_env["CORRAL_LEASE_TTL"] = "5"
    return Cli(corral_cmd, cli_env, corral_home)


def test_bad_options_are_one_line(cli: Cli) -> None:
    for args in (["--ttl", "soon"], ["--budget", "0s"], ["--budget", "1x"],
                 ["--store", "ftp://x"]):
        out = cli.run("reap", *args)
        assert out.returncode == 2, (args, out)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("corral: error:"), out.stderr
        assert "Traceback" not in out.stderr
    out = cli.run("reap", "--max-runs", "-3")
    assert out.returncode == 2 and "--max-runs" in out.stderr and "Traceback" not in out.stderr


def test_reap_finalizes_leaves_producing_alone_then_expires(cli: Cli) -> None:
    done = cli.start("done", "printf 'one\\ntwo\\n'; echo warn >&2")
    busy = cli.start("busy", "echo started; exec sleep 600")
    wait_until(lambda: exited(done), "the finished agent to exit", timeout=30)
    wait_until(lambda: b"started" in busy.journal.read_bytes(),
               "the busy agent's output", timeout=30)
    busy_before = (cli.raw("busy"), cli.log("busy"))

    first = cli.run("reap", "--json")
    assert first.returncode == 0, first.stderr
    result = json.loads(first.stdout)
    assert set(result) == {"considered", "probed", "outcomes", "runs"}
    assert result["considered"] == 2 and result["probed"] == 2
    assert result["outcomes"]["finalized"] == 1 and result["outcomes"]["producing"] == 1
    assert sum(result["outcomes"].values()) == 2 and len(result["outcomes"]) == 8
    by_id = {r["run_id"]: r for r in result["runs"]}
    assert by_id["done"] == {"run_id": "done", "outcome": "finalized", "status": "completed",
                             "exit_code": 0}
    assert by_id["busy"] == {"run_id": "busy", "outcome": "producing"}
    assert cli.text("done") == "one\ntwo\n"
    assert cli.log("done")[-1]["type"] == "RUN_FINISHED" and cli.closed("done")
    assert not cli.sandbox_exists("done")
    assert not done.journal.exists()  # pruned: the run is terminal
    assert (cli.raw("busy"), cli.log("busy")) == busy_before
    assert cli.sandbox_exists("busy") and supervisor_alive(busy)

    table = cli.run("reap", "--ttl", "1h")
    assert table.returncode == 0, table.stderr
    assert "busy" in table.stdout and "producing" in table.stdout
    assert "considered 1, probed 1: producing 1" in table.stdout

    expire = cli.run("reap", "--ttl", "0s", "--budget", "1s", "--json")
    assert expire.returncode == 0, expire.stderr
    result = json.loads(expire.stdout)
    assert result["runs"] == [{"run_id": "busy", "outcome": "expired", "status": "aborted"}]
    record = cli.raw("busy")
    assert record["status"] == "aborted" and record["cancel_requested"] is True
    assert cli.closed("busy") and "started" in cli.text("busy")
    assert not cli.sandbox_exists("busy")
    wait_until(lambda: not supervisor_alive(busy), "the expired agent to be stopped", timeout=10)


def test_two_reapers_at_once_drive_each_run_at_most_once(cli: Cli) -> None:
    ids = [f"r{i}" for i in range(4)]
    paths = [cli.start(run_id, f"echo output of {run_id}") for run_id in ids]
    busy = cli.start("busy", "echo x; exec sleep 600")
    for p in paths:
        wait_until(lambda p=p: exited(p), "agents to exit", timeout=30)
    wait_until(lambda: b"x" in busy.journal.read_bytes(), "the busy agent's output", timeout=30)
    busy_before = (cli.raw("busy"), cli.log("busy"))
    procs = [cli.popen("reap", "--json") for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    results = [json.loads(out) for out, _ in outs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    finalized = [r["run_id"] for res in results for r in res["runs"] if r["outcome"] == "finalized"]
    assert sorted(finalized) == ids  # each run finalized by exactly one of them
    for res in results:
        assert res["outcomes"]["failed"] == 0 and res["outcomes"]["reclaim-failed"] == 0
    for run_id in ids:
        record = cli.raw(run_id)
        # One claim to start it, exactly one to finish it: the loser never bumped the epoch.
        assert record["driver_epoch"] == 2, record
        assert record["status"] == "completed"
        log = cli.log(run_id)
        assert cli.text(run_id) == f"output of {run_id}\n"
        assert [e["type"] for e in log].count("RUN_FINISHED") == 1
    assert (cli.raw("busy"), cli.log("busy")) == busy_before
    cli.run("cancel", "busy")


def test_destroy_failing_in_the_provider_is_reclaim_failed(
    cli: Cli, request: pytest.FixtureRequest
) -> None:
    from corral.testing._plugin import require

    done = cli.start("stuck", "echo transcript")
    wait_until(lambda: exited(done), "the agent to exit", timeout=30)
    ref = cli.raw("stuck")["sandbox_ref"]
    sandbox = cli.home / "sandboxes" / ref["provider"] / ref["id"]
    # A mount point cannot be renamed: the provider's destroy fails for real (EBUSY).
    mounted = subprocess.run(["mount", "--bind", str(sandbox), str(sandbox)],
                             capture_output=True, check=False).returncode == 0
    require(request.config, mounted, "root with mount(2) to make a sandbox undeletable",
            "run the tests as root in a container that allows bind mounts")
    try:
        out = cli.run("reap", "--json")
        assert out.returncode == 1, out.stderr  # a leak is worth a non-zero exit
        result = json.loads(out.stdout)
        assert result["outcomes"]["reclaim-failed"] == 1
        (entry,) = result["runs"]
        assert (entry["outcome"], entry["status"], entry["exit_code"]) == (
            "reclaim-failed", "completed", 0)
        assert "stuck" in entry["error"] and "busy" in entry["error"].lower()
        assert cli.text("stuck") == "transcript\n" and cli.closed("stuck")
        assert cli.raw("stuck")["status"] == "completed"
        assert sandbox.exists()
    finally:
        subprocess.run(["umount", str(sandbox)], check=False)
    again = json.loads(cli.run("reap", "--json").stdout)
    assert again["considered"] == 0  # terminal: not retried by the sweep (reported once)
