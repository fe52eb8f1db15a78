"""Durable runs end to end: real bubblewrap sandboxes, real SQLite, real `corral` processes.

Every test drives the CLI in subprocesses (as users and other tools do) and checks the
store directly.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from corral.journal._layout import JournalPaths, read_status
from corral.journal._supervisor import process_alive
from tests.corral_cli import CliHome
from tests.helpers import wait_until

pytestmark = pytest.mark.usefixtures("need_bwrap_runs")

# 40 lines, 25 ms apart: long enough to be killed in the middle.
TICKER = ["sh", "-c", "i=0; while [ $i -lt 40 ]; do echo tick $i; i=$((i+1)); sleep 0.025; done"]


class Cli(CliHome):
    def record(self, run_id: str) -> dict[str, Any]:
        out = self.run("show", run_id, "--json")
        assert out.returncode == 0, out.stderr
        data: dict[str, Any] = json.loads(out.stdout)
        return data

    def raw_record(self, run_id: str) -> dict[str, Any]:
        record = self.raw(run_id)
        assert record is not None, f"no run {run_id}"
        return record

@pytest.fixture
def cli(corral_cmd: list[str], cli_env: dict[str, str], corral_home: Path) -> Cli:
    cli_env["CORRAL_LEASE_TTL"] = "3"
    return Cli(corral_cmd, cli_env, corral_home)


def live_sandboxes() -> list[str]:
    import anyio

    from corral.providers import get_provider

    async def ids() -> list[str]:
        return [ref.id for ref in await get_provider("bubblewrap").list()]

    return anyio.run(ids)


def normalized(events: list[dict[str, Any]], run_id: str) -> list[str]:
    return [json.dumps(e, sort_keys=True).replace(run_id, "RUN") for e in events]


def ndjson(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def stdout_text(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")


def test_run_streams_and_exits_with_the_outcome(cli: Cli) -> None:
    ok = cli.run("run", "--run-id", "ok", "--json", "--", "sh", "-c", "printf 'a\\nb'; echo x >&2")
    assert ok.returncode == 0, ok.stderr
    printed = ndjson(ok.stdout)
    assert [p["offset"] for p in printed] == list(range(1, len(printed) + 1))
    events = [p["event"] for p in printed]
    assert events == cli.log("ok")
    assert events[0]["type"] == "RUN_STARTED" and events[-1]["type"] == "RUN_FINISHED"
    assert stdout_text(events) == "a\nb"
    rec = cli.record("ok")
    assert set(rec) >= {"run_id", "thread_id", "status", "exit_code", "error", "started_at",
                        "finished_at", "detached_since", "cancel_requested", "driver_epoch",
                        "sandbox_key"}
    assert (rec["status"], rec["exit_code"]) == ("completed", 0)

    bad = cli.run("run", "--run-id", "bad", "--json", "--", "sh", "-c", "echo oops >&2; exit 7")
    assert bad.returncode == 7
    last = cli.log("bad")[-1]
    assert last["type"] == "RUN_ERROR" and "oops" in last["message"]
    rec = cli.record("bad")
    assert (rec["status"], rec["exit_code"]) == ("failed", 7)

    killed = cli.run("run", "--run-id", "sig", "--", "sh", "-c", "kill -9 $$")
    assert killed.returncode != 0
    rec = cli.record("sig")
    assert rec["status"] == "failed" and rec["exit_code"] == 128 + signal.SIGKILL
    assert "SIGKILL" in json.dumps(cli.log("sig")[-1])


def test_user_mistakes_are_one_line(cli: Cli) -> None:
    for args in (["run"], ["attach", "nope"], ["show", "nope"], ["cancel", "nope"],
                 ["run", "--provider", "warp", "--", "true"], ["attach", "x", "--after", "-1"]):
        out = cli.run(*args)
        assert out.returncode != 0, args
        assert "Traceback" not in out.stderr, (args, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1, (args, out.stderr)
    cli.run("run", "--run-id", "dup", "--", "true")
    again = cli.run("run", "--run-id", "dup", "--", "true")
    assert again.returncode != 0 and "already exists" in again.stderr


def test_sigkill_of_the_driver_then_attach_equals_an_uninterrupted_run(cli: Cli) -> None:
    reference = cli.run("run", "--run-id", "ref", "--json", "--", *TICKER)
    assert reference.returncode == 0, reference.stderr
    expected = normalized(cli.log("ref"), "ref")
    # Kill after this many delivered events: 1 = right after RUN_STARTED, while the sandbox
    # is being made; then the start batch, the middle, the end. Every step a driver can die
    # at is covered at library level (test_kill_points.py, property-based); these are the
    # real SIGKILLs of a `corral run` process (each costs two CLI starts: they were 20
    # random points, the slowest test of this file).
    for i, seen in enumerate((1, 2, 9, 21, 34, 42)):
        run_id = f"kill-{i}"
        proc = cli.popen("run", "--run-id", run_id, "--json", "--", *TICKER)
        assert proc.stdout is not None
        for _ in range(seen):
            if not proc.stdout.readline():
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        att = cli.run("attach", run_id, "--json", timeout=60)
        assert att.returncode == 0, (i, att.stderr)
        log = cli.log(run_id)
        assert normalized(log, run_id) == expected, f"kill point {i} ({seen} events)"
        # attach printed the whole log exactly once
        assert [p["event"] for p in ndjson(att.stdout)] == log
        assert cli.record(run_id)["status"] == "completed"


def test_takeover_of_a_dead_local_driver_does_not_wait_for_its_lease(cli: Cli) -> None:
    # A lease of an hour: the attach can only finish within its 60 s if it breaks the dead
    # driver's lease at once (the driver was on this machine and is provably gone).
    cli.env["CORRAL_LEASE_TTL"] = "3600"
    proc = cli.popen("run", "--run-id", "fast", "--json", "--", "sh", "-c",
                     "echo start; sleep 1; echo end")
    assert proc.stdout is not None and "RUN_STARTED" in proc.stdout.readline()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    att = cli.run("attach", "fast", "--json", timeout=60)
    assert att.returncode == 0, att.stderr
    assert stdout_text(cli.log("fast")) == "start\nend\n"


def test_attach_after_offset_prints_only_the_rest(cli: Cli) -> None:
    cli.run("run", "--run-id", "aft", "--", "sh", "-c", "echo 1; echo 2; echo 3")
    full = cli.log("aft")
    out = cli.run("attach", "aft", "--after", "3", "--json")
    assert out.returncode == 0
    printed = ndjson(out.stdout)
    assert [p["offset"] for p in printed] == list(range(4, len(full) + 1))
    assert [p["event"] for p in printed] == full[3:]


def test_two_attachers_on_a_detached_run_one_drives_both_see_everything(cli: Cli) -> None:
    out = cli.run("run", "--detach", "--run-id", "two", "--", *TICKER)
    assert out.returncode == 0 and out.stdout.strip() == "two"
    rec = cli.raw_record("two")
    assert rec["detached_since"] is not None and rec["driver_epoch"] == 1
    a, b = cli.popen("attach", "two", "--json"), cli.popen("attach", "two", "--json")
    out_a, err_a = a.communicate(timeout=60)
    out_b, err_b = b.communicate(timeout=60)
    assert a.returncode == 0 and b.returncode == 0, (err_a, err_b)
    log = cli.log("two")
    assert [p["event"] for p in ndjson(out_a)] == log
    assert [p["event"] for p in ndjson(out_b)] == log
    rec = cli.raw_record("two")
    assert rec["status"] == "completed"
    assert rec["driver_epoch"] == 2, "exactly one attacher took the claim"
    assert rec.get("detached_since") is None
    assert stdout_text(log) == "".join(f"tick {i}\n" for i in range(40))


def _agent_pid(cli: Cli, run_id: str) -> int:
    journal = cli.raw_record(run_id)["journal"]
    status = read_status(JournalPaths.for_run(journal["dir"], run_id).status)
    assert status is not None and status.agent_pid is not None
    return int(status.agent_pid)


def test_cancel_from_another_process(cli: Cli) -> None:
    driver = cli.popen("run", "--run-id", "can", "--json", "--", "sh", "-c",
                       "echo up; sleep 60; echo never")
    assert driver.stdout is not None and "RUN_STARTED" in driver.stdout.readline()
    wait_until(lambda: "up" in stdout_text(cli.log("can")), "the agent's first line", timeout=10)
    pid = _agent_pid(cli, "can")
    sandbox_id = cli.raw_record("can")["sandbox_ref"]["id"]
    assert process_alive(pid)
    out = cli.run("cancel", "can")
    assert out.returncode == 0, out.stderr
    # well before its `sleep 60` would end (how fast is for bench/, not a pass/fail test)
    wait_until(lambda: not process_alive(pid), "the agent to stop", timeout=30)
    rest, _ = driver.communicate(timeout=20)
    rec = cli.record("can")
    assert rec["status"] == "aborted" and rec["cancel_requested"] is True
    log = cli.log("can")
    assert log[-1]["type"] == "RUN_ERROR" and cli.closed("can")
    assert "never" not in stdout_text(log)
    # the foreground viewer printed the end of the log too
    assert ndjson(rest)[-1]["event"]["type"] == "RUN_ERROR"
    assert sandbox_id not in live_sandboxes()
    # a cancelled run cannot be resurrected by attach
    again = cli.run("attach", "can", "--json")
    assert again.returncode != 0 and len(ndjson(again.stdout)) == len(log)


def test_cancel_of_a_detached_run(cli: Cli) -> None:
    cli.run("run", "--detach", "--run-id", "dcan", "--", "sleep", "60")
    pid = _agent_pid(cli, "dcan")
    out = cli.run("cancel", "dcan")
    assert out.returncode == 0
    wait_until(lambda: not process_alive(pid), "the agent to stop", timeout=2)
    rec = cli.record("dcan")
    assert rec["status"] == "aborted"
    assert cli.log("dcan")[-1]["type"] == "RUN_ERROR" and cli.closed("dcan")


def test_sigint_detaches_and_a_second_one_cancels(cli: Cli) -> None:
    proc = cli.popen("run", "--run-id", "int1", "--json", "--", "sh", "-c",
                     "echo a; sleep 1; echo b")
    assert proc.stdout is not None and "RUN_STARTED" in proc.stdout.readline()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130
    assert "corral attach int1" in err and "corral cancel int1" in err
    rec = cli.raw_record("int1")
    assert rec.get("detached_since") is not None or rec["status"] == "completed"
    att = cli.run("attach", "int1", "--json")
    assert att.returncode == 0 and stdout_text(cli.log("int1")) == "a\nb\n"

    proc = cli.popen("run", "--run-id", "int2", "--json", "--", "sleep", "60")
    assert proc.stdout is not None and "RUN_STARTED" in proc.stdout.readline()
    proc.send_signal(signal.SIGINT)
    # The first signal was handled once the run is stamped detached; the second must come
    # within two seconds of the first.
    wait_until(lambda: cli.raw_record("int2").get("detached_since") is not None,
               "the detach stamp", timeout=1.5)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=20)
    rec = cli.record("int2")
    assert rec["status"] == "aborted" and rec["cancel_requested"] is True


def test_sigterm_detaches(cli: Cli) -> None:
    proc = cli.popen("run", "--run-id", "term", "--json", "--", "sh", "-c", "sleep 0.5; echo z")
    assert proc.stdout is not None and "RUN_STARTED" in proc.stdout.readline()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130 and "detached" in err
    att = cli.run("attach", "term", "--json")
    assert att.returncode == 0 and stdout_text(cli.log("term")) == "z\n"


HOSTILE = r"""
import os, sys
out = sys.stdout.buffer
# look-alike sentinels with every hex string the agent can find on its side
seen = set()
for root in ("/proc/self", "/proc/1"):
    for name in ("environ", "cmdline", "status"):
        try:
            data = open(os.path.join(root, name), "rb").read()
        except OSError:
            continue
        word = b""
        for ch in data + b" ":
            c = bytes([ch])
            if c in b"0123456789abcdef":
                word += c
            else:
                if len(word) >= 8:
                    seen.add(word)
                word = b""
for h in sorted(seen)[:200]:
    out.write(b'{"corral_exit":1,"code":0,"signal":null,"nonce":"' + h + b'"}\n')
out.write(b"\n" + b'{"corral_exit":1,"code":0,"signal":null,"nonce":"' + b"0" * 32 + b'"}\n')
out.write(b"\xff\xfe invalid utf8\n")
out.write(b"x" * (20 * 1024 * 1024) + b"\n")
out.flush()
pid = os.fork()
if pid == 0:
    import time
    time.sleep(0.2)
    out.write(b"late child\n")
    out.flush()
    os._exit(0)
out.write(b"no final newline")
out.flush()
os._exit(5)
"""


def test_hostile_agent_cannot_end_the_run_early(cli: Cli, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "hostile.py").write_text(HOSTILE)
    out = cli.run("run", "--run-id", "hostile", "--workspace", str(ws), "--json", "--",
                  "python3", "hostile.py", timeout=120)
    assert out.returncode == 5, out.stderr[-2000:]
    log = cli.log("hostile")
    text = stdout_text(log)
    assert text.endswith("no final newline")
    assert "x" * (20 * 1024 * 1024) in text
    assert log[-1]["type"] == "RUN_ERROR"
    rec = cli.record("hostile")
    assert (rec["status"], rec["exit_code"]) == ("failed", 5)


def test_no_sandbox_is_left_behind(cli: Cli) -> None:
    for i in range(3):
        cli.run("run", "--run-id", f"leak-{i}", "--", "true")
    assert live_sandboxes() == []


def test_timeout_stops_the_command_and_fails_the_run(cli: Cli) -> None:
    out = cli.run("run", "--run-id", "slow", "--timeout", "1.5", "--json", "--",
                  "sh", "-c", "echo begun; sleep 60; echo never", timeout=40)
    assert out.returncode == 124, out.stderr
    events = cli.log("slow")
    assert "begun" in stdout_text(events) and "never" not in stdout_text(events)
    assert events[-1]["type"] == "RUN_ERROR" and "timeout of 1.5s" in events[-1]["message"]
    rec = cli.record("slow")
    assert (rec["status"], rec["exit_code"]) == ("failed", 124)
    quick = cli.run("run", "--run-id", "quick", "--timeout", "30", "--", "echo", "fine")
    assert quick.returncode == 0 and cli.record("quick")["status"] == "completed"
    for bad in ("0", "-3", "soon", "inf"):
        res = cli.run("run", "--timeout", bad, "--", "true")
        assert res.returncode == 2 and "--timeout" in res.stderr and "Traceback" not in res.stderr
    res = cli.run("run", "--token-budget", "100", "--", "true")
    assert res.returncode != 0 and "token_budget" in res.stderr and "Traceback" not in res.stderr


def test_file_events_flag(cli: Cli, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "old.txt").write_text("old\n")
    out = cli.run("run", "--run-id", "fe", "--workspace", str(ws), "--file-events", "diff",
                  "--json", "--", "sh", "-c", "echo new > new.txt; rm old.txt")
    assert out.returncode == 0, out.stderr
    events = [e["event"] for e in ndjson(out.stdout)]
    files = {(e["value"]["type"], e["value"]["path"]) for e in events
             if e["type"] == "CUSTOM" and e["name"] == "sandbox.file"}
    assert files == {("create", "new.txt"), ("delete", "old.txt")}
    diffs = {e["value"]["path"]: e["value"]["diff"] for e in events
             if e["type"] == "CUSTOM" and e["name"] == "sandbox.file.diff"}
    assert "+new" in diffs["new.txt"]
    text = cli.run("run", "--workspace", str(ws), "--file-events", "--", "touch", "t.txt")
    assert text.returncode == 0 and "[file] create t.txt" in text.stderr, text.stderr
    assert (ws / "old.txt").exists()  # the workspace was a copy
