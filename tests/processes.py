"""Processes the test suite starts, found by a marker in their environment.

Every process a test starts inherits ``CORRAL_TEST_SESSION`` (corral's detached helpers, the
run supervisor and the services daemon, pass it on too: :func:`corral.journal._supervisor.
child_env`). Its value names the session, the xdist worker and the test (or ``-`` outside a
test: a module's or the session's fixtures), so a process that outlives what started it is
found in ``/proc/*/environ`` and named by the test that started it, without touching any
process another suite on the machine started.

- a test that fails or times out has the processes it started ended (their process
  groups first) at its teardown (``tests/conftest.py``);
- at the end of the session, whatever the session started and is still there after a
  bounded wait is ended and reported as an error naming each process.

``tests/conftest.py`` imports the hooks and fixtures below; ``pytest -p tests.processes``
loads them into another suite (``tests/test_suite_hygiene.py`` does).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

MARKER = "CORRAL_TEST_SESSION"


def session_tag() -> str:
    """This session's base tag: inherited from the xdist controller, else a new one."""
    base = os.environ.get(MARKER, "").split("|", 1)[0]
    return base or uuid.uuid4().hex


def tag(base: str, worker: str, test: str = "-") -> str:
    return f"{base}|{worker}|{test}"


@dataclass(frozen=True, slots=True)
class Proc:
    pid: int
    tag: str
    cmdline: str

    @property
    def test(self) -> str:
        return self.tag.split("|", 2)[2] if self.tag.count("|") >= 2 else "-"

    def describe(self) -> str:
        return f"pid {self.pid} ({self.cmdline[:160]}) started by {self.test}"


def _environ_tag(pid: int) -> str | None:
    try:
        data = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    prefix = MARKER.encode() + b"="
    for item in data.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix):].decode(errors="replace")
    return None


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip() or "?"


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X")


def tagged(match: Callable[[str], bool], exclude: frozenset[int] = frozenset()) -> list[Proc]:
    """Live (not zombie) processes whose marker ``match`` accepts, but ``exclude`` and this
    process and its ancestors (the pytest processes themselves carry the session's tag)."""
    skip = set(exclude) | _ancestors()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in skip:
            continue
        pid = int(entry)
        value = _environ_tag(pid)
        if value is not None and match(value) and not _zombie(pid):
            found.append(Proc(pid, value, _cmdline(pid)))
    return found


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[-1].split()[1])
    return pids


def end(procs: list[Proc], grace: float = 2.0) -> None:
    """SIGTERM each process's group (when it leads one) and the process, then SIGKILL what
    is left after ``grace`` seconds."""
    mine = os.getpgrp()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in procs:
            try:
                group = os.getpgid(proc.pid)
                if group == proc.pid and group != mine:
                    os.killpg(group, sig)
                os.kill(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_alive(p.pid) for p in procs):
            time.sleep(0.05)


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and not _zombie(pid)


def wait_gone(match: Callable[[str], bool], timeout: float) -> list[Proc]:
    """The matching processes still there after up to ``timeout`` seconds of waiting for
    them to exit (those ending on their own as the session closes are not leaks)."""
    deadline = time.monotonic() + timeout
    while True:
        left = tagged(match)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


# ---------------------------------------------------------------- pytest hooks and fixtures


def pytest_configure(config: pytest.Config) -> None:
    """Tag every process this session starts (see the module docstring): the xdist controller
    sets the session's tag before it starts its workers, each worker adds its id."""
    worker = getattr(config, "workerinput", {}).get("workerid", "main")
    config.stash[_TAG] = (session_tag(), worker)
    os.environ[MARKER] = tag(*config.stash[_TAG])


_TAG = pytest.StashKey[tuple[str, str]]()
_REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Iterator[None]:
    report = yield
    item.stash.setdefault(_REPORTS, {})[report.when] = report
    return report


@pytest.fixture(autouse=True)
def _test_processes_end(request: pytest.FixtureRequest) -> Iterator[None]:
    """The processes a test starts carry its id; if it fails or times out (pytest-timeout
    fails it), those still running are ended at its teardown, process groups first."""
    base, worker = request.config.stash[_TAG]
    mine = tag(base, worker, request.node.nodeid)
    os.environ[MARKER] = mine
    try:
        yield
    finally:
        os.environ[MARKER] = tag(base, worker)
    reports = request.node.stash.get(_REPORTS, {})
    if any(r.failed for r in reports.values()):
        left = tagged(lambda value: value == mine)
        if left:
            end(left)
            sys.stderr.write("ended what the failed test left running: "
                             + "; ".join(p.describe() for p in left) + "\n")


@pytest.fixture(scope="session", autouse=True)
def _no_process_outlives_the_session(request: pytest.FixtureRequest) -> Iterator[None]:
    """Nothing this session (this worker) started outlives it: after the other session
    fixtures ended (sandboxes destroyed, servers stopped) and a bounded wait for what is
    exiting anyway (``CORRAL_TEST_EXIT_WAIT`` seconds, default 15), whatever still runs is
    ended and reported as an error naming it."""
    yield
    base, worker = request.config.stash[_TAG]
    prefix = tag(base, worker, "")
    wait = float(os.environ.get("CORRAL_TEST_EXIT_WAIT", "15"))
    left = wait_gone(lambda value: value.startswith(prefix), timeout=wait)
    if left:
        end(left)
        pytest.fail(f"{len(left)} process(es) started by the tests outlived the session "
                    "(ended now): " + "; ".join(p.describe() for p in left), pytrace=False)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """The xdist controller, once its workers are gone: a worker that died (a crash, a
    timeout's hard exit) never ran its own check, so whatever its tests started and is
    still there is ended here, and the session fails naming it."""
    config = session.config
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return  # a worker, or no workers: the session fixture checked
    base, _ = config.stash[_TAG]
    prefix = f"{base}|gw"
    wait = float(os.environ.get("CORRAL_TEST_EXIT_WAIT", "15"))
    left = wait_gone(lambda value: value.startswith(prefix), timeout=wait)
    if not left:
        return
    end(left)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    message = (f"{len(left)} process(es) started by the tests outlived their worker (ended "
               "now): " + "; ".join(p.describe() for p in left))
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_line(message, red=True, bold=True)
    else:
        sys.stderr.write(message + "\n")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
