"""A harness from another package, end to end: registered only through the
``corral.harnesses`` entry point of a test-only package (tests/plugins/plug_harness.py),
it runs a durable run in one process; that process is SIGKILLed, a second attaches and
follows the run to its end, and a third (``corral reap``) finishes another abandoned run of
it, each rebuilding the harness with the typed configuration the run recorded. Without the
package, or for a harness only ``register_harness`` knew in the starting process, another
process says so in one line and leaves the run as it was.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from corral import Runner, RunRequest, open_store
from corral.harness import register_harness, unregister_harness
from corral.journal._layout import JournalPaths, read_status
from tests.corral_cli import CliHome
from tests.helpers import wait_until
from tests.plugins import plug_harness, read_until

PACKAGE = {"name": plug_harness.DIST, "version": plug_harness.VERSION}


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Path:
    return plug_harness.install(tmp_path / "site")


@pytest.fixture
def cli(corral_cmd: list[str], cli_env: dict[str, str], corral_home: Path,
        plugin_dir: Path) -> CliHome:
    cli_env["CORRAL_LEASE_TTL"] = "5"
    cli_env["PYTHONPATH"] = os.pathsep.join([str(plugin_dir), cli_env["PYTHONPATH"]])
    return CliHome(corral_cmd, cli_env, corral_home)


def _script(go: Path, *lines: str) -> str:
    """Prints ``lines[:-1]``, waits for the test's go-ahead (a host file: the local
    provider does not isolate), prints ``lines[-1]``."""
    first = "; ".join(f"echo {line}" for line in lines[:-1])
    return f'{first}; while [ ! -e "{go}" ]; do sleep 0.05; done; echo {lines[-1]}'


def _start(cli: CliHome, run_id: str, tag: str, script: str) -> subprocess.Popen[str]:
    return cli.popen("run", "--harness", "plug-sh", "--model", tag, "--provider", "local",
                     "--run-id", run_id, "--json", "--", script)


def _kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
    if proc.stderr is not None:
        proc.stderr.close()


def _exited(paths: JournalPaths) -> bool:
    st = read_status(paths.status)
    return st is not None and st.state == "exited"


def _text(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")


def _ends(events: list[dict[str, Any]]) -> list[Any]:
    """The events the harness makes of the agent's exit, as logged."""
    return [(e["type"], e.get("value")) for e in events
            if e["type"] in ("RUN_FINISHED", "RUN_ERROR") or e.get("name") == "plug.exit"]


def _lease_lapsed(cli: CliHome, run_id: str) -> bool:
    record = cli.raw(run_id)
    assert record is not None
    return record.get("claim_owner") is None or float(record["claim_expires_at"]) < time.time()


def test_an_entry_point_harness_is_taken_over_after_a_sigkill_and_reaped_elsewhere(
    cli: CliHome, tmp_path: Path
) -> None:
    go_p, go_q = tmp_path / "go-p", tmp_path / "go-q"
    # Process 1 runs two runs of the plugin's harness and dies in each.
    first = _start(cli, "p", "blue", _script(go_p, "one", "two", "three"))
    read_until(first, "two")
    _kill(first)
    record = cli.raw("p")
    assert record is not None and record["status"] == "running"
    assert record["harness"] == "plug-sh"
    assert record["spec"]["harness_package"] == PACKAGE
    assert record["spec"]["harness_options"] == {"model": "blue"}
    started = int(record["driver_epoch"])

    other = _start(cli, "q", "green", _script(go_q, "x", "y"))
    read_until(other, "x")
    _kill(other)

    # Process 2 attaches to p and follows it to its end: every event once, in order.
    second = cli.popen("attach", "p", "--json")
    printed = read_until(second, "two")
    wait_until(lambda: int(cli.raw("p")["driver_epoch"]) == started + 1,
               "the attach to hold the claim", timeout=30)
    go_p.touch()
    rest, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    printed += [json.loads(line) for line in rest.splitlines() if line.strip()]
    log = cli.log("p")  # gap-free offsets, checked by the helper
    assert [p["offset"] for p in printed] == list(range(1, len(log) + 1))
    assert [p["event"] for p in printed] == log
    assert _text(log) == "one\ntwo\nthree\n"
    # the exit translated by the harness rebuilt here, with the run's recorded config
    assert _ends(log) == [("CUSTOM", {"tag": "blue"}), ("RUN_FINISHED", None)]
    done = cli.raw("p")
    assert done["status"] == "completed" and done["exit_code"] == 0 and cli.closed("p")
    assert int(done["driver_epoch"]) == started + 1

    # q finishes with nobody driving it; process 3 reaps it once its lease has lapsed.
    go_q.touch()
    wait_until(lambda: _exited(cli.journal("q")), "q's agent to exit", timeout=30)
    wait_until(lambda: _lease_lapsed(cli, "q"), "q's dead driver's lease to lapse",
               timeout=30)
    sandbox = cli.raw("q")["sandbox_ref"]
    out = cli.run("reap", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["runs"] == [
        {"run_id": "q", "outcome": "finalized", "status": "completed", "exit_code": 0}]
    log = cli.log("q")
    assert _text(log) == "x\ny\n"
    assert _ends(log) == [("CUSTOM", {"tag": "green"}), ("RUN_FINISHED", None)]
    assert cli.closed("q")
    assert not (cli.home / "sandboxes" / "local" / sandbox["id"]).exists()


def test_without_the_package_a_process_names_it_and_leaves_the_run(
    cli: CliHome, tmp_path: Path, plugin_dir: Path
) -> None:
    go = tmp_path / "go"
    out = cli.run("run", "--harness", "plug-sh", "--model", "blue", "--provider", "local",
                  "--run-id", "r", "--detach", "--", _script(go, "one", "two"))
    assert out.returncode == 0, out.stderr
    before = cli.raw("r")
    logged = cli.log("r")
    with_plugin = cli.env["PYTHONPATH"]
    cli.env["PYTHONPATH"] = with_plugin.replace(str(plugin_dir) + os.pathsep, "")

    out = cli.run("attach", "r", "--json")
    assert out.returncode != 0
    (line,) = [x for x in out.stderr.splitlines() if "error" in x]
    assert "harness 'plug-sh' is not installed here" in line
    assert "install the package 'corral-plug-harness' 0.3" in line
    assert "corral.harnesses" in line

    go.touch()
    wait_until(lambda: _exited(cli.journal("r")), "the agent to exit", timeout=30)
    out = cli.run("reap", "--json")
    (entry,) = json.loads(out.stdout)["runs"]
    assert entry["outcome"] == "unknown"
    assert "install the package 'corral-plug-harness' 0.3" in entry["error"]
    # nothing claimed, logged or ended by the processes that lack the harness
    assert cli.raw("r") == before and cli.log("r") == logged

    cli.env["PYTHONPATH"] = with_plugin
    out = cli.run("attach", "r", "--json")
    assert out.returncode == 0, out.stderr
    log = cli.log("r")
    assert _text(log) == "one\ntwo\n"
    assert _ends(log) == [("CUSTOM", {"tag": "blue"}), ("RUN_FINISHED", None)]


@pytest.fixture
def in_process() -> Any:
    register_harness("plug-local", plug_harness.PlugShHarness)
    yield
    unregister_harness("plug-local")


@pytest.mark.anyio
async def test_a_harness_registered_in_one_process_is_refused_clearly_elsewhere(
    in_process: None, cli: CliHome, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    store = await open_store(f"sqlite:///{cli.db}")
    runner = Runner(store)
    await runner.start(RunRequest(prompt=_script(go, "one", "two"), harness="plug-local",
                                  options={"model": "red"}, provider="local", run_id="s"))
    await runner.detach("s")
    before = cli.raw("s")
    assert before is not None and before["spec"]["harness_package"]["in_process"] is True

    out = cli.run("attach", "s", "--json")
    assert out.returncode != 0
    (line,) = [x for x in out.stderr.splitlines() if "error" in x]
    assert "harness 'plug-local' is not installed here" in line
    assert "only the process that started the run registered it" in line
    go.touch()
    wait_until(lambda: _exited(cli.journal("s")), "the agent to exit", timeout=30)
    out = cli.run("reap", "--json")
    (entry,) = json.loads(out.stdout)["runs"]
    assert entry["outcome"] == "unknown" and "register_harness" in entry["error"]
    assert cli.raw("s") == before

    # the process that registered it drives the run to its end
    result = await runner.drive("s")
    assert result.record.status.value == "completed"
    log = cli.log("s")
    assert _text(log) == "one\ntwo\n"
    assert _ends(log) == [("CUSTOM", {"tag": "red"}), ("RUN_FINISHED", None)]
