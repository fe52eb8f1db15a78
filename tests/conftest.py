"""Shared fixtures. Tests run the CLI as ``python -m corral`` from this checkout's src."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from corral.stores._protocols import Store
from corral.testing._plugin import require
from corral.stores import open_store
from tests.processes import pytest_sessionfinish as processes_sessionfinish
from tests.processes import (  # noqa: F401 - hooks and fixtures, found by name
    _no_process_outlives_the_session,
    _test_processes_end,
    pytest_configure,
    pytest_runtest_makereport,
)
from tests.docker_support import need_docker  # noqa: F401 - a fixture, found by name
from tests.helpers import drop_postgres_database, postgres_store

SRC = Path(__file__).resolve().parent.parent / "src"

# corral's key comes from each test's store unless a test sets CORRAL_SECRET itself (a
# developer's own, inherited by every CLI process a test starts, would hide the store's).
os.environ.pop("CORRAL_SECRET", None)


@pytest.fixture
def anyio_backend() -> str:
    """asyncio unless a directory or module says otherwise: the store, pipe, journal,
    reaper, provider-kit and kit-machinery suites run on asyncio and trio (their own
    ``anyio_backend`` fixtures). The rest stay on asyncio: the server runs under uvicorn
    (asyncio), and the other suites were not moved."""
    return "asyncio"


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """Each backend in turn (a directory's conftest may give its own ``store``); PostgreSQL
    in a fresh schema of this test process's database (``tests.helpers.postgres_store``)."""
    if request.param == "postgres":
        async with postgres_store() as s:
            yield s
        return
    url = "memory://" if request.param == "memory" else f"sqlite://{tmp_path / 'corral.db'}"
    s = await open_store(url)
    try:
        yield s
    finally:
        await s.aclose()


@pytest.hookimpl(trylast=True)  # after xdist stopped its workers
def pytest_sessionfinish(session: pytest.Session) -> None:
    drop_postgres_database()  # the PostgreSQL tests' database, if this run made one
    processes_sessionfinish(session)  # what a worker that died left running


@pytest.fixture(scope="session", autouse=True)
def _no_sandbox_outlives_the_session(tmp_path_factory: pytest.TempPathFactory,
                                     request: pytest.FixtureRequest) -> Iterator[None]:
    """Destroy the bubblewrap sandboxes tests left in their homes under this session's
    temporary directory (a test may end with runs that still hold theirs, e.g. servers
    killed mid-run): their cgroups and disk-pool subvolumes would outlive the directories
    that name them, on every CI run."""
    # set up first, so torn down last: its check comes after the sandboxes are destroyed
    request.getfixturevalue("_no_process_outlives_the_session")
    yield
    import anyio

    from corral.providers._bubblewrap import BubblewrapProvider

    base = tmp_path_factory.getbasetemp()
    homes = {state.parents[3] for depth in range(1, 4)
             for state in base.glob("*/" * depth + "sandboxes/bubblewrap/sb-*/state.json")}

    async def destroy_all(home: Path) -> None:
        provider = BubblewrapProvider(home=home)
        for ref in await provider.list():
            await provider.destroy(ref)

    for home in sorted(homes):
        anyio.run(destroy_all, home)


@pytest.fixture
def corral_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private ``$CORRAL_HOME`` for one test."""
    home = tmp_path / "corral-home"
    home.mkdir()
    monkeypatch.setenv("CORRAL_HOME", str(home))
    yield home


@pytest.fixture
def bwfiles() -> Iterator[Path]:
    """A private bubblewrap files root (``CORRAL_BWRAP_FILES``) the sandbox uid can traverse
    (tmp_path cannot be: pytest makes it 0700), so a leak scan covers exactly this test's
    sandboxes. Its disk-quota pool, if one was made there, is unmounted at the end."""
    from corral.providers import _diskquota as diskquota

    root = Path(tempfile.mkdtemp(prefix="corral-bw-", dir="/var/tmp"))
    root.chmod(0o755)
    yield root
    diskquota.release(root)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def cli_env(corral_home: Path) -> dict[str, str]:
    """Environment for running ``corral`` in a subprocess against this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env["CORRAL_HOME"] = str(corral_home)
    return env


E2E = Path(__file__).resolve().parent / "server" / "e2e"


@pytest.fixture
def e2e(request: pytest.FixtureRequest) -> Path:
    """``tests/server/e2e`` with its pinned node packages installed (playwright-core, the
    official ``@ag-ui/client``): ``npm ci`` once when one is missing."""
    require(request.config, shutil.which("node") is not None, "node", "apt-get install nodejs")
    modules = E2E / "node_modules"
    if not all((modules / name).is_dir() for name in ("playwright-core", "@ag-ui/client")):
        npm = shutil.which("npm")
        require(request.config, npm is not None, "npm", "apt-get install npm")
        assert npm is not None
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=E2E, check=True,
                       capture_output=True, timeout=300)
    return E2E


CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture
def page_driver(request: pytest.FixtureRequest, e2e: Path) -> Path:
    """``tests/server/e2e`` ready to drive the web page in headless Chromium."""
    require(request.config, CHROMIUM.exists(), "Chromium at /usr/bin/chromium",
            "apt-get install chromium")
    return e2e


@pytest.fixture
def screenshots(request: pytest.FixtureRequest) -> Path:
    """Where a page test keeps its screenshots: ``$CORRAL_ARTIFACTS/screenshots/<test>``
    (default ``<repo>/artifacts``, git-ignored; CI keeps the directory)."""
    root = Path(os.environ.get("CORRAL_ARTIFACTS") or SRC.parent / "artifacts")
    path = root / "screenshots" / request.node.name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


@pytest.fixture
def corral_cmd() -> list[str]:
    return [sys.executable, "-m", "corral"]


def bwrap_works() -> bool:
    """Whether bubblewrap can make the namespaces corral's sandboxes need."""
    if shutil.which("bwrap") is None:
        return False
    out = subprocess.run(
        ["bwrap", "--unshare-all", "--unshare-user", "--ro-bind", "/", "/", "true"],
        capture_output=True,
        check=False,
    )
    return out.returncode == 0


@pytest.fixture
def need_bwrap_runs(request: pytest.FixtureRequest) -> None:
    require(request.config, bwrap_works(), "bubblewrap with user namespaces",
            "apt-get install bubblewrap (and allow unprivileged user namespaces)")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Closing lines tests leave as ``record_property("…_summary"-like)`` properties: the
    policy differential test's tally (it runs on an xdist worker; properties travel)."""
    for report in terminalreporter.stats.get("passed", []):
        for name, value in getattr(report, "user_properties", ()):
            if name == "policy_differential":
                terminalreporter.write_line(str(value))
