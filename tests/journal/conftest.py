"""Fixtures for journal tests: launch real supervised agents and always clean them up."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from corral.journal._layout import JournalPaths, read_status
from corral.journal._sentinel import new_nonce
from corral.journal._supervisor import AgentSpec, SupervisedRun, kill_supervised, launch_supervised

PY = sys.executable
BASE_ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"}


@dataclass
class Launched:
    paths: JournalPaths
    nonce: str
    run: SupervisedRun


def wait_for(cond: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    """Poll ``cond`` until true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


def wait_exited(paths: JournalPaths, timeout: float = 20.0) -> None:
    def done() -> bool:
        st = read_status(paths.status)
        return st is not None and st.state == "exited"

    wait_for(done, timeout, f"the supervisor of {paths.token} to record the exit")


@pytest.fixture
def jdir(tmp_path: Path) -> Path:
    d = tmp_path / "host-private"
    d.mkdir(mode=0o700)
    return d


@pytest.fixture
def launch(jdir: Path) -> Iterator[Callable[..., Launched]]:
    launched: list[Launched] = []
    counter = iter(range(10**6))

    def _launch(
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        stdin: bytes | None = None,
        cwd: str | None = None,
        kill_stragglers: bool = True,
    ) -> Launched:
        paths = JournalPaths.for_run(jdir, f"run-{next(counter)}")
        nonce = new_nonce()
        spec = AgentSpec(argv=list(argv), env=dict(env or BASE_ENV), cwd=cwd, stdin=stdin)
        run = launch_supervised(spec, paths, nonce, kill_stragglers=kill_stragglers)
        item = Launched(paths, nonce, run)
        launched.append(item)
        return item

    yield _launch
    for item in launched:  # never leave processes behind
        kill_supervised(item.paths, grace=2.0, include_supervisor=True)
