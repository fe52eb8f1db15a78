"""Hostile agents against the real supervisor and reader (DESIGN §8 fault tests)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from pathlib import Path

import anyio
import pytest

from corral.journal._reader import Exit, Line, probe_journal_tail, read_journal
from corral.journal._sentinel import format_trailer
from corral.journal._supervisor import process_start_time
from corral.testing._plugin import require

from corral.testing import wait_until

from .conftest import run_async, BASE_ENV, PY, Launched, wait_exited

SYSTEM_PY = "/usr/bin/python3"  # readable by any uid (the venv may live under /root)

# The agent scans everything it can read for 32+ hex-char strings and forges a sentinel with
# each one. It reports its candidates on stderr, blocks until SIGUSR1, then exits 7.
HUNTER = r"""
import json, os, re, signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
read_mem = sys.argv[1] == "mem"
HEX = re.compile(rb"[0-9a-fA-F]{32,}")
found = set()
def scan(data):
    for m in HEX.finditer(data):
        s = m.group().lower()
        for i in range(len(s) - 31):
            found.add(s[i:i + 32].decode())
def slurp(path, limit=1 << 24):
    try:  # non-blocking: its own stdout is a pipe, which would block a reader forever
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            scan(os.read(fd, limit))
        finally:
            os.close(fd)
    except OSError:
        pass
def link(path):
    try:
        scan(os.readlink(path).encode())
    except OSError:
        pass
scan(json.dumps(dict(os.environ)).encode()); scan(json.dumps(sys.argv).encode())
ppid = os.getppid()
for pid in ("self", str(ppid)):
    base = f"/proc/{pid}"
    for name in ("cmdline", "environ", "status", "stat", "maps", "comm", "cwd", "root",
                 "exe", "mountinfo", "limits", "sched", "wchan", "io"):
        slurp(f"{base}/{name}"); link(f"{base}/{name}")
    try:
        fds = os.listdir(f"{base}/fd")
    except OSError:
        fds = []
    for fd in fds:
        link(f"{base}/fd/{fd}"); slurp(f"{base}/fd/{fd}")
if read_mem:
    try:
        maps = open(f"/proc/{ppid}/maps").read().splitlines()
        with open(f"/proc/{ppid}/mem", "rb") as mem:
            for line in maps:
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                if "r" in line.split()[1] and hi - lo < (1 << 26):
                    try:
                        mem.seek(lo); scan(mem.read(hi - lo))
                    except (OSError, ValueError, OverflowError):
                        pass
    except OSError as exc:
        print(json.dumps({"mem_error": str(exc)}), file=sys.stderr, flush=True)
out = sys.stdout.buffer
for h in sorted(found):
    for code, sig in ((0, "null"), (1, "9")):
        out.write(b'{"corral_exit":1,"code":%d,"signal":%s,"nonce":"%s"}\n' % (code, sig.encode(), h.encode()))
    out.write(b' {"corral_exit":1,"code":0,"signal":null,"nonce":"%s"}\n' % h.encode())
    out.write(b'{"corral_exit":1,"code":0.0,"signal":null,"nonce":"%s"}\n' % h.encode())
    out.write(b'{"corral_exit":1,"code":true,"signal":null,"nonce":"%s"}\n' % h.encode())
    out.write(b'{"__exit":0,"__nonce":"%s"}\n' % h.encode())
out.write(b"ready\n"); out.flush()
print(json.dumps({"candidates": sorted(found)}), file=sys.stderr, flush=True)
signal.sigwait({signal.SIGUSR1})
last = sorted(found)[0].encode() if found else b"0" * 32
out.write(b'{"corral_exit":1,"code":0,"signal":null,"nonce":"%s"}' % last)  # no final newline
out.flush()
sys.exit(7)
"""

DECOY = "0123456789abcdef0123456789abcdef"


def collect(launched: Launched) -> tuple[list[Line], Exit]:
    async def go() -> tuple[list[Line], Exit]:
        lines: list[Line] = []
        with anyio.fail_after(30):
            async for item in read_journal(launched.paths, nonce=launched.nonce):
                if isinstance(item, Exit):
                    return lines, item
                lines.append(item)
        raise AssertionError("journal ended without an exit")

    return run_async(go)


def run_hunter(launch, argv_prefix: list[str], mode: str) -> tuple[Launched, dict[str, object]]:
    env = dict(BASE_ENV, DECOY=DECOY)
    run = launch([*argv_prefix, SYSTEM_PY, "-c", HUNTER, mode], env)
    wait_until(lambda: run.paths.journal.read_bytes().endswith(b"ready\n"),
               "hunter ready", timeout=30)
    # Its report goes to stderr after "ready": another pipe, copied by another pump.
    wait_until(lambda: b'"candidates"' in run.paths.stderr.read_bytes(),
               "the hunter's report", timeout=30)
    report: dict[str, object] = {}
    for line in run.paths.stderr.read_bytes().splitlines():
        report.update(json.loads(line))
    return run, report


def assert_supervisor_does_not_expose(run: Launched) -> None:
    nonce = run.nonce.encode()
    pid = run.run.supervisor_pid
    for name in ("cmdline", "environ"):
        with open(f"/proc/{pid}/{name}", "rb") as f:
            assert nonce not in f.read(), name
    for fd in os.listdir(f"/proc/{pid}/fd"):
        assert nonce not in os.readlink(f"/proc/{pid}/fd/{fd}").encode()
    agent = run.run.agent_pid
    assert agent is not None
    for name in ("cmdline", "environ"):
        with open(f"/proc/{agent}/{name}", "rb") as f:
            assert nonce not in f.read(), f"agent {name}"
    journal_files = {str(run.paths.journal), str(run.paths.stderr)}
    for fd in os.listdir(f"/proc/{agent}/fd"):
        target = os.readlink(f"/proc/{agent}/fd/{fd}")
        # stdout/stderr are pipes to the supervisor; nothing else, and never the journal
        assert target not in journal_files, f"agent holds the journal on fd {fd}"
        assert fd in ("1", "2") or "pipe:" not in target, f"agent inherited a pipe on fd {fd}"


def finish_hunter(run: Launched, report: dict[str, object]) -> None:
    candidates = report["candidates"]
    assert isinstance(candidates, list)
    assert DECOY in candidates, "the hunter's scan is broken: it missed a planted hex string"
    assert run.nonce not in candidates
    assert run.run.agent_pid is not None
    os.kill(run.run.agent_pid, signal.SIGUSR1)
    lines, exit = collect(run)
    assert (exit.code, exit.signal) == (7, None)
    text = b"\n".join(line.data for line in lines)
    forged = sum(1 for line in lines if b'"corral_exit"' in line.data)
    assert forged == 5 * len(candidates) + 1  # every forgery was delivered as plain output
    assert text.endswith(b"ready\n" + b'{"corral_exit":1,"code":0,"signal":null,"nonce":"'
                         + min(candidates).encode() + b'"}')
    probe = probe_journal_tail(run.paths, run.nonce)
    assert (probe.state, probe.code) == ("finished", 7)
    probe = probe_journal_tail(run.paths.journal, run.nonce)
    assert (probe.state, probe.code) == ("finished", 7)


def test_root_agent_cannot_find_or_forge_the_nonce(launch) -> None:
    run, report = run_hunter(launch, [], "nomem")
    assert_supervisor_does_not_expose(run)
    finish_hunter(run, report)


def test_unprivileged_agent_cannot_read_supervisor_memory(launch, request) -> None:
    setpriv = shutil.which("setpriv")
    require(request.config, setpriv is not None, "setpriv (util-linux)", "apt-get install util-linux")
    require(request.config, os.geteuid() == 0, "running as root", "run this test as root")
    assert setpriv is not None
    run, report = run_hunter(
        launch, [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"], "mem"
    )
    assert "mem_error" in report  # non-dumpable supervisor: its memory is closed to the agent
    finish_hunter(run, report)


def test_huge_line_invalid_utf8_and_no_final_newline(launch) -> None:
    body = b"a" * (20 << 20) + b"\n" + b"\xff\xfe\xc3( bad\x00\n" + b"tail \xe2\x82"
    script = "import sys; sys.stdout.buffer.write(sys.stdin.buffer.read())"
    run = launch([PY, "-c", script], stdin=body)
    lines, exit = collect(run)
    assert exit.code == 0
    assert len(lines) == 3 and len(lines[0].data) == 20 << 20
    assert b"\n".join(line.data for line in lines) == body
    assert lines[-1].end_offset == len(body) + 1  # terminated by the supervisor's separator


def test_agent_closing_stdout_early(launch) -> None:
    run = launch(["sh", "-c", "printf partial; exec 1>&-; echo closed >&2; exit 4"])
    lines, exit = collect(run)
    assert [line.data for line in lines] == [b"partial"]
    assert (exit.code, exit.stderr_tail) == (4, b"closed\n")


def test_children_in_the_agents_group_are_stopped_at_exit(launch) -> None:
    run = launch(["sh", "-c",
                  "(while true; do echo late; sleep 0.01; done) & echo pid=$! ; echo parent"])
    lines, exit = collect(run)
    assert exit.code == 0
    # the child may print before its parent does: find the parent's line, not the first one
    (child,) = [int(line.data[4:]) for line in lines if line.data.startswith(b"pid=")]
    wait_until(lambda: process_start_time(child) is None or _zombie(child),
               "straggler dead", timeout=20.0)
    journal = run.paths.journal.read_bytes()
    assert journal.endswith(format_trailer(run.nonce, 0, None))


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True


# An escaped child (own session) outlives the agent and keeps writing. It holds the agent's
# stdout, which is a pipe to the supervisor, never the journal: reopening /proc/self/fd/1
# reads that pipe (it can never see the sentinel, let alone copy its nonce), and nothing it
# writes after the agent's exit reaches the journal.
ESCAPER = r"""
import os, sys, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    os.close(r)
    os.write(1, b"child-started\n")
    target = os.readlink("/proc/self/fd/1")
    os.write(2, target.encode() + b"\n")
    os.close(w)  # only now may the agent exit: its stderr tail must hold the line above
    while not os.path.exists(sys.argv[1]):  # the test saw the run's end
        time.sleep(0.005)
    for _ in range(50):
        os.write(1, b"late\n")
    time.sleep(600)
os.close(w)
os.read(r, 1)  # EOF once the child has written its first line
print(os.getpid() + 0, flush=True)
sys.exit(9)
"""


def test_escaped_child_writing_after_exit_is_ignored(launch, tmp_path: Path) -> None:
    go = tmp_path / "go"
    run = launch([PY, "-c", ESCAPER, str(go)])
    straggler = None
    try:
        lines, exit = collect(run)  # terminates at the real sentinel: no hang
        assert (exit.code, exit.signal) == (9, None)
        assert lines[0].data == b"child-started"
        assert exit.stderr_tail.startswith(b"pipe:")  # the straggler's stdout: not the journal
        straggler = _find_straggler(run.run.agent_pid)
        assert straggler is not None
        go.touch()
        wait_until(lambda: not _supervisor_running(run), "the supervisor's exit", timeout=20.0)
        # its writes fail once the supervisor is gone (EPIPE), which ends it
        wait_until(lambda: _zombie(straggler), "the straggler's writes", timeout=20.0)
        journal = run.paths.journal.read_bytes()
        assert journal.endswith(format_trailer(run.nonce, 9, None))
        assert b"late" not in journal
        lines2, exit2 = collect(run)
        assert (exit2.code, lines2) == (9, lines)
        assert probe_journal_tail(run.paths, run.nonce).code == 9
    finally:
        if straggler is None:
            straggler = _find_straggler(run.run.agent_pid)
        if straggler is not None:
            os.kill(straggler, signal.SIGKILL)


def _supervisor_running(run: Launched) -> bool:
    st = process_start_time(run.run.supervisor_pid)
    return st is not None and not _zombie(run.run.supervisor_pid)


def _find_straggler(agent_pid: int | None) -> int | None:
    """The escaped child: the process whose command line is the ESCAPER script."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == agent_pid:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"child-started" in f.read():
                    return int(pid)
        except OSError:
            continue
    return None


@pytest.mark.parametrize("tail", [b"", b"no newline", b"line\n"])
def test_lookalike_trailer_written_by_the_agent_itself(launch, tail: bytes) -> None:
    fake = format_trailer("f" * 32, 0, None)
    script = "import sys; sys.stdout.buffer.write(sys.stdin.buffer.read())"
    body = b"x\n" + fake + tail
    run = launch([PY, "-c", script + "; sys.exit(3)"], stdin=body)
    lines, exit = collect(run)
    assert exit.code == 3
    assert b"\n".join(line.data for line in lines) == body
    wait_exited(run.paths)
    assert re.search(rb'"code":3,', run.paths.journal.read_bytes()[-120:])
