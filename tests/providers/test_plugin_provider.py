"""A provider from another package, end to end: registered only through the
``corral.providers`` entry point of a test-only package (tests/plugins/plug_provider.py),
it starts a durable run in one process, survives a takeover by a second and is reaped and
reclaimed by ``corral reap`` in a third, each rebuilding it with the configuration the
records carry. Without the package, the record's provider fails with a message naming it.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from corral.journal._layout import JournalPaths, read_status
from tests.corral_cli import CliHome
from tests.helpers import wait_until
from tests.plugins import plug_provider, read_until

# Prints two lines, waits for the test's go-ahead (a host file: the local provider does not
# isolate), prints a third.
SCRIPT = ('echo one; echo two; while [ ! -e "$1" ]; do sleep 0.05; done; echo three; '
          'echo made > made.txt')


class Cli(CliHome):
    def instance(self, key: str) -> dict[str, Any] | None:
        with sqlite3.connect(self.db) as conn:
            row = conn.execute("SELECT doc FROM instances WHERE key = ?", (key,)).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    def epoch(self, run_id: str) -> int:
        record = self.raw(run_id)
        return int(record["driver_epoch"]) if record else 0


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Path:
    return plug_provider.install(tmp_path / "site")


@pytest.fixture
def cli(corral_cmd: list[str], cli_env: dict[str, str], corral_home: Path,
        plugin_dir: Path) -> Cli:
    cli_env["CORRAL_LEASE_TTL"] = "5"
    cli_env["PYTHONPATH"] = os.pathsep.join([str(plugin_dir), cli_env["PYTHONPATH"]])
    return Cli(corral_cmd, cli_env, corral_home)


def _config(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    (project / "README").write_text("a workspace\n")
    config = project / "plug.toml"
    config.write_text('[provider]\nname = "plug"\ntag = "blue"\n')
    return config


def _exited(paths: JournalPaths) -> bool:
    st = read_status(paths.status)
    return st is not None and st.state == "exited"


def _text(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")


def test_an_entry_point_provider_survives_takeover_and_is_reaped_in_a_third_process(
    cli: Cli, tmp_path: Path
) -> None:
    config, go = _config(tmp_path), tmp_path / "go"
    # Process 1 starts the run on the plugin's provider, then dies mid-run.
    first = cli.popen("run", "--config", str(config), "--run-id", "p", "--json",
                      "--file-events", "--", "sh", "-c", SCRIPT, "sh", str(go))
    read_until(first, "one")
    first.send_signal(signal.SIGKILL)
    first.wait()
    record = cli.raw("p")
    assert record is not None and record["status"] == "running"
    started = cli.epoch("p")
    ref = record["sandbox_ref"]
    assert ref["provider"] == "plug"
    sandbox = cli.home / "sandboxes" / "plug" / ref["id"]
    assert sandbox.is_dir()
    instance = cli.instance(record["sandbox_key"])
    assert instance is not None and instance["provider"] == "plug"
    assert instance["meta"]["provider"] == {"name": "plug", "config": {"tag": "blue"},
                                            "package": "corral-plug"}

    # Process 2 takes the run over, prints every event once, then detaches.
    second = cli.popen("attach", "p", "--json")
    printed = read_until(second, "two")
    wait_until(lambda: cli.epoch("p") == started + 1, "the attach to hold the claim", timeout=30)
    second.send_signal(signal.SIGTERM)
    rest, err = second.communicate(timeout=30)
    assert second.returncode == 130, err
    printed += [json.loads(line) for line in rest.splitlines() if line.strip()]
    assert [p["offset"] for p in printed] == list(range(1, len(printed) + 1))
    assert [p["event"] for p in printed] == cli.log("p")[: len(printed)]
    assert cli.raw("p")["detached_since"] is not None

    # The agent finishes with nobody driving; process 3 reaps the run and reclaims the
    # sandbox through the provider rebuilt from the registry with the recorded config.
    go.touch()
    wait_until(lambda: _exited(cli.journal("p")), "the agent to exit", timeout=30)
    out = cli.run("reap", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["runs"] == [{"run_id": "p", "outcome": "finalized", "status": "completed",
                               "exit_code": 0}]
    log = cli.log("p")  # gap-free offsets, checked by the helper
    assert _text(log) == "one\ntwo\nthree\n"
    # the reaper's catch-up of file events reached the sandbox through the rebuilt provider
    files = [e for e in log if e["type"] == "CUSTOM" and e["name"] == "sandbox.file"]
    assert [f["value"]["path"] for f in files] == ["made.txt"], files
    assert [e["type"] for e in log].count("RUN_FINISHED") == 1 and cli.closed("p")
    assert cli.epoch("p") == started + 2  # one claim for the takeover, one for the reaper
    assert not sandbox.exists()
    assert cli.instance(record["sandbox_key"]) is None
    destroyed = (cli.home / "plug-destroyed.log").read_text().split("\n")
    assert f"blue {ref['id']}" in destroyed


def test_without_the_package_the_record_names_it(cli: Cli, tmp_path: Path,
                                                 plugin_dir: Path) -> None:
    config = _config(tmp_path)
    out = cli.run("run", "--config", str(config), "--run-id", "q", "--detach",
                  "--", "true")
    assert out.returncode == 0, out.stderr
    wait_until(lambda: _exited(cli.journal("q")), "the agent to exit", timeout=30)
    ref = cli.raw("q")["sandbox_ref"]
    sandbox = cli.home / "sandboxes" / "plug" / ref["id"]

    # The reaper of a host without the package: the run is finalized (its journal needs no
    # provider), the sandbox is left alone and the error says what to install.
    cli.env["PYTHONPATH"] = cli.env["PYTHONPATH"].replace(str(plugin_dir) + os.pathsep, "")
    out = cli.run("reap", "--json")
    assert out.returncode == 1, out.stderr
    (entry,) = json.loads(out.stdout)["runs"]
    assert (entry["outcome"], entry["status"]) == ("reclaim-failed", "completed")
    assert "unknown provider 'plug'" in entry["error"]
    assert "install the package 'corral-plug'" in entry["error"]
    assert "register_provider" in entry["error"]
    assert sandbox.is_dir()  # nothing guessed, nothing destroyed by another provider
