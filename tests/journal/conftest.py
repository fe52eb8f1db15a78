"""Fixtures for journal tests: launch real supervised agents and always clean them up.

Every journal test runs on both anyio backends (the reader and the async launcher are anyio
code an application may drive from trio): async parts go through :func:`run_async`."""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar
from pathlib import Path

import anyio
import pytest

from corral.journal._layout import JournalPaths, read_status
from corral.journal._sentinel import new_nonce
from corral.journal._supervisor import AgentSpec, SupervisedRun, kill_supervised, launch_supervised
from corral.testing import wait_until

PY = sys.executable
T = TypeVar("T")
_BACKEND = ["asyncio"]


@pytest.fixture(autouse=True, scope="module", params=["asyncio", "trio"])
def journal_backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """The anyio backend :func:`run_async` uses in this test (module scope: hypothesis
    tests take no function-scoped fixtures)."""
    _BACKEND[0] = str(request.param)
    yield _BACKEND[0]
    _BACKEND[0] = "asyncio"


def run_async(fn: Callable[[], Awaitable[T]]) -> T:
    """Run ``fn`` on the current test's anyio backend."""
    return anyio.run(fn, backend=_BACKEND[0])


BASE_ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"}


@dataclass
class Launched:
    paths: JournalPaths
    nonce: str
    run: SupervisedRun


def wait_exited(paths: JournalPaths, timeout: float = 20.0) -> None:
    def done() -> bool:
        st = read_status(paths.status)
        return st is not None and st.state == "exited"

    wait_until(done, f"the supervisor of {paths.token} to record the exit", timeout=timeout)


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
