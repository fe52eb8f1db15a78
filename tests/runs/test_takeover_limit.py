"""A turn that keeps killing its host stops (#27): a run whose drivers die one after the
other, each before the run makes progress, is ended ``failed`` (code ``takeover_limit``)
by the driver after the limit, instead of being taken over again and again. A driver that
lets go cleanly (a detach) is no takeover, and progress resets the count."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.corral_cli import CliHome
from tests.helpers import wait_until

pytestmark = pytest.mark.usefixtures("need_bwrap_runs")


@pytest.fixture
def cli(corral_cmd: list[str], cli_env: dict[str, str], corral_home: Path) -> CliHome:
    cli_env["CORRAL_LEASE_TTL"] = "3"
    cli_env["CORRAL_MAX_TAKEOVERS"] = "2"
    return CliHome(corral_cmd, cli_env, corral_home)


def _held_at(cli: CliHome, run_id: str, epoch: int) -> bool:
    raw = cli.raw(run_id) or {}
    return raw.get("driver_epoch", 0) >= epoch and raw.get("claim_owner") is not None


def test_a_run_whose_drivers_keep_dying_is_ended_after_the_limit(cli: CliHome) -> None:
    # silent after its first line: nothing a takeover could log is progress
    proc = cli.popen("run", "--run-id", "doomed", "--", "sh", "-c", "echo up; sleep 600",
                     quiet=True)
    wait_until(lambda: "up" in cli.text("doomed") if cli.raw("doomed") else False,
               "the run started", timeout=60)
    epoch = (cli.raw("doomed") or {})["driver_epoch"]
    for n in (1, 2):  # two takeovers die without progress (the limit is 2)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc = cli.popen("attach", "doomed", quiet=True)
        # the takeover writes its count once it holds the claim
        wait_until(lambda n=n: _held_at(cli, "doomed", epoch + n) and (
            (cli.raw("doomed") or {}).get("takeovers") or {}).get("count") == n,
            f"takeover {n}", timeout=60)
        assert (cli.raw("doomed") or {})["status"] == "running"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    ended = cli.run("attach", "doomed", timeout=60)
    assert ended.returncode != 0
    raw = cli.raw("doomed") or {}
    assert raw["status"] == "failed" and raw["error"]["code"] == "takeover_limit", raw
    assert "2 drivers in a row took it over and died" in raw["error"]["message"]
    assert cli.log("doomed")[-1]["type"] == "RUN_ERROR"


def test_a_clean_detach_or_progress_is_no_dying_takeover(cli: CliHome) -> None:
    proc = cli.popen("run", "--run-id", "fine", "--", "sh", "-c",
                     "echo up; while [ ! -e go ]; do sleep 0.1; done; echo end", quiet=True)
    wait_until(lambda: "up" in cli.text("fine") if cli.raw("fine") else False,
               "the run started", timeout=60)
    for _ in range(3):  # detaching is letting go: never counted
        proc.send_signal(signal.SIGTERM)
        proc.wait()
        wait_until(lambda: (cli.raw("fine") or {}).get("claim_owner") is None, "released",
                   timeout=60)
        proc = cli.popen("attach", "fine", quiet=True)
        epoch = (cli.raw("fine") or {})["driver_epoch"]
        wait_until(lambda e=epoch: _held_at(cli, "fine", e + 1), "attached", timeout=60)
        assert not (cli.raw("fine") or {}).get("takeovers")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    sandbox = (cli.raw("fine") or {})["sandbox_ref"]["id"]
    cli.run("exec", "--sandbox", sandbox, "--", "touch", "/workspace/go")
    done = cli.run("attach", "fine", timeout=60)
    assert done.returncode == 0, done.stderr
    assert (cli.raw("fine") or {})["status"] == "completed"
