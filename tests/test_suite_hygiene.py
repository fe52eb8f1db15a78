"""The test command itself (issue #26, defect 6): ``scripts/test.sh`` runs every phase
whatever an earlier one did and ends with one pytest summary of them all; a test that fails
or times out ends the processes it started; nothing the suite started outlives it.

Each runs the real scripts and pytest in subprocesses on tiny suites of its own."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers import wait_until

REPO = Path(__file__).resolve().parent.parent
PHASES = REPO / "scripts" / "test_phases.sh"


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "CORRAL_TEST_SESSION"))}
    env["PYTHONPATH"] = str(REPO)
    return env


def _suite(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "suite"
    root.mkdir()
    # a rootdir of its own: not this repository's pyproject (its options, its conftest)
    (root / "pytest.ini").write_text("[pytest]\naddopts = -p tests.processes\n")
    for name, text in files.items():
        (root / name).write_text(textwrap.dedent(text))
    return root


def test_every_phase_runs_and_the_last_line_sums_them(tmp_path: Path) -> None:
    root = _suite(tmp_path, {
        "test_serial.py": """
            def test_one_fails():
                assert False, "the serial phase fails"
            def test_one_passes():
                pass
            """,
        "test_rest.py": """
            import pytest
            def test_a(): pass
            def test_b(): pass
            @pytest.mark.skip(reason="said")
            def test_c(): pass
            """,
    })
    env = {**_env(tmp_path), "CORRAL_TEST_CHECKS": "0", "CORRAL_TEST_WORKERS": "0"}
    out = subprocess.run(["bash", str(PHASES), sys.executable, "test_serial.py", "--"],
                         cwd=root, env=env, capture_output=True, text=True, timeout=300)
    lines = out.stdout.strip().splitlines()
    # Before: `set -e` ended the script at the failing serial phase; test_rest.py never ran.
    assert out.returncode != 0, out.stdout
    assert "test_rest.py" in out.stdout and "3 passed" not in out.stdout.split("== pytest\n")[0]
    assert "failed phases: pytest: the docker provider's tests, alone (exit 1)" in out.stdout
    assert lines[-1].startswith("=") and lines[-1].endswith("=")
    assert " 1 failed, 3 passed, 1 skipped in " in lines[-1], lines[-1]

    ok = subprocess.run(["bash", str(PHASES), sys.executable, "--", "test_rest.py"],
                        cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert " 2 passed, 1 skipped in " in ok.stdout.strip().splitlines()[-1]


LEAVER = """
    import os, subprocess, sys, time
    from pathlib import Path
    import pytest

    def _start():
        # a daemon of its own session, as corral's supervisor and services daemon are
        proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
        Path(os.environ["PIDS"]).open("a").write(f"{proc.pid}\\n")

    def test_fails_leaving_a_process():
        _start()
        assert False

    def test_passes_leaving_a_process():
        _start()

    @pytest.mark.timeout(2)
    def test_times_out_leaving_a_process():
        _start()
        time.sleep(120)

    def test_kills_its_worker_leaving_a_process():
        _start()
        os._exit(3)  # as a crash would: no teardown, no session fixture
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.mark.parametrize("which", ["fails", "times_out", "passes", "kills_its_worker"])
def test_processes_a_test_leaves_are_ended_and_named(tmp_path: Path, which: str) -> None:
    root = _suite(tmp_path, {"test_leaver.py": LEAVER})
    pids = tmp_path / "pids"
    env = {**_env(tmp_path), "PIDS": str(pids), "CORRAL_TEST_EXIT_WAIT": "1"}
    started = time.monotonic()
    workers = ["-n", "1"] if which == "kills_its_worker" else []  # xdist's controller
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          *workers, f"test_leaver.py::test_{which}_leaving_a_process"],
                         cwd=root, env=env, capture_output=True, text=True, timeout=300)
    [pid] = [int(p) for p in pids.read_text().split()]
    try:
        text = out.stdout + out.stderr
        assert out.returncode != 0, text
        if which == "kills_its_worker":
            # found by the controller once its workers are gone
            assert "outlived their worker" in text, text
        elif which != "passes":
            # ended at the failed (or timed out) test's teardown, named there
            assert "ended what the failed test left running" in text, text
        else:
            # a passing test's daemon is found at the session's end, ended, and reported
            assert "outlived the session" in text and "sleep 300" in text, text
            assert "test_passes_leaving_a_process" in text, text
        assert f"pid {pid}" in text
        wait_until(lambda: not _alive(pid), "the left process to be gone", timeout=10)
        assert time.monotonic() - started < 120
    finally:
        if _alive(pid):
            os.kill(pid, 9)


def _serial_files() -> list[str]:
    """The files scripts/test.sh runs alone, before the rest (the rest pass ignores them)."""
    text = (REPO / "scripts" / "test.sh").read_text()
    start = text.index("serial=(")
    return text[start + len("serial=("):text.index(")", start)].split()


def test_the_serial_files_collect() -> None:
    """The rest pass ignores the serial files, so a broken import in one of them shows only
    in the docker pass: collect them here too (once a moved helper failed CI that way)."""
    files = _serial_files()
    assert files and all((REPO / f).is_file() for f in files), files
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "-p", "no:cacheprovider", *files],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
