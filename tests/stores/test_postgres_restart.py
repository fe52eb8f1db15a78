"""A PostgreSQL server restarted under a running ``corral run``: the run goes on in its
sandbox, the driver reconnects and continues from its journal, and the log ends equal to an
uninterrupted run's: nothing lost, nothing repeated. A private cluster of this test's own
(``pg_createcluster``), so the restart touches no other test's database."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.testing._plugin import require
from tests.helpers import pg_log, wait_until

SRC = Path(__file__).resolve().parents[2] / "src"
LINES = 80


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ctl(*args: str) -> None:
    subprocess.run(["pg_ctlcluster", *args], check=True, capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[tuple[str, str, int]]:
    """A throwaway PostgreSQL cluster for this module: (version, name, port). Each test
    leaves it running."""
    require(request.config, shutil.which("pg_createcluster") is not None and os.geteuid() == 0,
            "pg_createcluster (postgresql-common) and root", "apt-get install postgresql")
    versions = sorted(os.listdir("/usr/lib/postgresql"), key=int)
    version, name, port = versions[-1], f"corral_{secrets.token_hex(4)}", _free_port()
    subprocess.run(["pg_createcluster", version, name, "--port", str(port), "--",
                    "--auth=trust"], check=True, capture_output=True, timeout=120)
    try:
        _ctl(version, name, "start")
        yield version, name, port
    finally:
        subprocess.run(["pg_dropcluster", "--stop", version, name], capture_output=True,
                       timeout=120)


@pytest.mark.parametrize("outage", [10, 40], ids=["short", "longer-than-pool_wait"])
def test_a_run_survives_a_postgres_restart(cluster: tuple[str, str, int], tmp_path: Path,
                                           outage: int) -> None:
    """``outage``: lines the agent writes while the database is down. With ``pool_wait=1``
    the longer one outlasts many pool waits: the driver must keep waiting, not fail."""
    version, name, port = cluster
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres?pool_wait=1"
    env = {**os.environ, "CORRAL_HOME": str(tmp_path / "home"), "CORRAL_STORE": url,
           "PYTHONPATH": str(SRC)}
    (tmp_path / "home").mkdir()
    (tmp_path / "ws").mkdir()
    marker = tmp_path / "progress"  # the local provider does not isolate: a host path
    script = (f"i=0; while [ $i -lt {LINES} ]; do echo line $i; echo $i > {marker}; "
              "i=$((i+1)); sleep 0.1; done")

    def run(run_id: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "corral", "run", "--provider", "local", "--run-id", run_id,
             "--workspace", str(tmp_path / "ws"), "--", "sh", "-c", script],
            env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    driver = run(f"restarted-{outage}")
    wait_until(lambda: marker.exists() and marker.read_text().strip() not in ("", "0", "1"),
               "the run under way", timeout=60)
    _ctl(version, name, "stop", "-m", "fast")
    stopped_at = int(marker.read_text().strip() or 0)
    wait_until(lambda: int(marker.read_text().strip() or 0) >= stopped_at + outage,
               "the agent going on while the database is down", timeout=60)
    _ctl(version, name, "start")
    out, err = driver.communicate(timeout=120)
    assert driver.returncode == 0, err
    assert out == "".join(f"line {i}\n" for i in range(LINES))
    # One notice of the outage, not a warning per reconnect attempt.
    assert err.count("reconnecting") == 1, err
    assert "error connecting in" not in err, err
    assert "corral: error" not in err and "RUN_ERROR" not in err, err

    clean = run(f"clean-{outage}")
    clean_out, _ = clean.communicate(timeout=120)
    assert clean.returncode == 0 and clean_out == out
    restarted, reference = pg_log(url, f"restarted-{outage}"), pg_log(url, f"clean-{outage}")
    assert [e["type"] for e in restarted] == [e["type"] for e in reference]
    text = "".join(e.get("delta", "") for e in restarted if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == out


@pytest.mark.anyio
async def test_a_call_fails_clearly_once_the_outage_outlasts_outage_wait(
        cluster: tuple[str, str, int]) -> None:
    from corral.stores import StoreUnavailable, open_store

    version, name, port = cluster
    store = await open_store(
        f"postgresql://postgres@127.0.0.1:{port}/postgres?pool_wait=1&outage_wait=2")
    try:
        _ctl(version, name, "stop", "-m", "fast")
        with pytest.raises(StoreUnavailable, match="could not be reached for 2 s; nothing "
                                                   "was written"):
            await store.get("any")
        _ctl(version, name, "start")
        assert await store.get("any") is None  # and works again once it is back
    finally:
        await store.aclose()
