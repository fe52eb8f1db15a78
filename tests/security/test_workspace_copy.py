"""Attack tests for copying a host directory into a sandbox (security issue, defect 5).

Each test drives the real CLI (``python -m corral``) or the library against the real
bubblewrap provider:

* a big file is streamed, not built into an in-memory tar (peak RSS stays far below it);
* ``--workspace /`` and system directories are refused with one clear line;
* corral's own state (a CORRAL_HOME, the store file, journal directories) found inside the
  workspace never reaches the sandbox, and what was left out is reported;
* a size cap stops an oversized workspace with an error naming the limit and how to raise
  it, and leaves no sandbox behind;
* symlinks in the workspace never lead the copy to files outside it.
"""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import anyio
import pytest

from corral._errors import ConfigError
from corral.sandbox._sources import LocalDir

pytestmark = pytest.mark.usefixtures("need_bwrap_runs")

MiB = 1 << 20
CLI_TIMEOUT = 120.0


# Runs the CLI as its child and writes the child's peak RSS (KiB) to the file named first:
# RUSAGE_CHILDREN of a process that had no other child. RLIMIT_AS makes a regression (the
# whole host walked into memory) fail the test instead of taking the shared machine down.
_MEASURE = """
import resource, subprocess, sys
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
rc = subprocess.call(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    f.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(rc)
"""


def _corral(
    corral_cmd: list[str], env: dict[str, str], *args: str, tty_stderr: bool = False
) -> tuple[subprocess.CompletedProcess[str], int]:
    """Run the CLI; return its result and its peak RSS in bytes. ``tty_stderr``: its
    stderr is a terminal (a pty), as for a user at a shell."""
    fd, name = tempfile.mkstemp(prefix="corral-peak-rss-")
    os.close(fd)
    rss_file = Path(name)
    master = slave = -1
    if tty_stderr:
        master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", _MEASURE, str(rss_file), *corral_cmd, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=slave if tty_stderr else subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    tty_out: list[bytes] = []
    reader = None
    if tty_stderr:
        os.close(slave)
        reader = threading.Thread(target=_read_pty, args=(master, tty_out))
        reader.start()
    try:
        out, err = proc.communicate(timeout=CLI_TIMEOUT)
        if reader is not None:
            reader.join()
            err = b"".join(tty_out).decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(
            f"corral {' '.join(args)} took over {CLI_TIMEOUT}s: {err[-2000:]}"
        ) from None
    finally:
        text = rss_file.read_text()
        rss_file.unlink()
    peak = int(text) * 1024 if text else 0
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), peak


def _read_pty(fd: int, into: list[bytes]) -> None:
    try:
        while chunk := os.read(fd, 4096):
            into.append(chunk)
    except OSError:  # EIO: every writer closed it
        pass
    finally:
        os.close(fd)


def _sandboxes_left(home: Path) -> list[str]:
    root = home / "sandboxes" / "bubblewrap"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


# ------------------------------------------------------------------ bounded memory


def test_big_file_is_streamed_in_bounded_memory_with_progress_on_a_terminal(
    tmp_path: Path, cli_env: dict[str, str], corral_cmd: list[str]
) -> None:
    size = 768 * MiB
    ws = tmp_path / "ws"
    ws.mkdir()
    with open(ws / "big.bin", "wb") as f:
        f.truncate(size)  # sparse: costs no disk on the host side
    (ws / "small.txt").write_text("small\n")
    env = {**cli_env, "CORRAL_MAX_COPY_SIZE": "2GiB"}
    res, peak = _corral(
        corral_cmd, env, "run", "--workspace", str(ws), "--",
        "sh", "-c", "stat -c '%s' /workspace/big.bin; cat /workspace/small.txt",
        tty_stderr=True,
    )
    assert res.returncode == 0, res.stderr
    assert f"{size}" in res.stdout and "small" in res.stdout
    # The CLI process alone is ~60 MiB; an in-memory tar would be at least the file's size.
    assert 0 < peak < size // 4, f"peak RSS {peak / MiB:.0f} MiB for a {size // MiB} MiB file"
    # a terminal saw the copy progress, then a summary
    assert "corral: copying the workspace:" in res.stderr and " of 768 MiB (" in res.stderr
    assert "corral: copied the workspace: 768 MiB in 2 files" in res.stderr


# ------------------------------------------------------------------ refusals


def test_workspace_root_is_refused_with_one_clear_line(
    cli_env: dict[str, str], corral_cmd: list[str], corral_home: Path
) -> None:
    res, _ = _corral(corral_cmd, cli_env, "run", "--workspace", "/", "--", "true")
    assert res.returncode != 0
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert "'/'" in lines[0] and "system directory" in lines[0]
    assert "project" in lines[0]  # says what to do instead
    assert _sandboxes_left(corral_home) == []


@pytest.mark.parametrize(
    "path", ["/", "/proc", "/proc/self", "/sys", "/dev", "/usr", "/usr/bin", "/etc", "/bin",
             "/boot", "/lib", "/sbin", "/run", "/var", "/var/lib", "/home", "/tmp"],
)
def test_system_directories_are_refused(path: str) -> None:
    with pytest.raises(ConfigError, match="system directory"):
        LocalDir(path)


def test_a_project_directory_is_accepted(tmp_path: Path) -> None:
    assert LocalDir(str(tmp_path)).path == str(tmp_path.resolve())


# ------------------------------------------------------------------ corral's own state


def test_corral_state_inside_the_workspace_is_not_copied(
    tmp_path: Path, cli_env: dict[str, str], corral_cmd: list[str]
) -> None:
    ws = tmp_path / "home-dir"  # like --workspace ~ with the default ~/.corral
    ws.mkdir()
    (ws / "notes.txt").write_text("mine\n")
    # Another CORRAL_HOME inside the workspace, with a real store, journal and sandbox state
    # from an earlier run.
    other = {**cli_env, "CORRAL_HOME": str(ws / "old-home")}
    res, _ = _corral(corral_cmd, other, "run", "--", "echo", "earlier")
    assert res.returncode == 0, res.stderr
    # The current CORRAL_HOME and a store file kept elsewhere in the workspace.
    env = {**cli_env, "CORRAL_HOME": str(ws / ".corral"),
           "CORRAL_STORE": f"sqlite://{ws / 'data' / 'runs.db'}"}
    (ws / "data").mkdir()
    (ws / "data" / "keep.txt").write_text("keep\n")
    res, _ = _corral(corral_cmd, env, "run", "--", "echo", "first")  # populate both
    assert res.returncode == 0, res.stderr
    res, _ = _corral(
        corral_cmd, env, "run", "--workspace", str(ws), "--",
        "sh", "-c", "cd /workspace && find . | sort",
    )
    assert res.returncode == 0, res.stderr
    listing = res.stdout.split()
    assert "./notes.txt" in listing and "./data/keep.txt" in listing
    leaked = [p for p in listing if any(
        s in p for s in ("corral.db", "runs.db", "old-home", "journal", "sandboxes", "state.json")
    )]
    assert leaked == [], leaked
    # /workspace/.corral holds only the bootstrap marker, not the CORRAL_HOME
    assert [p for p in listing if p.startswith("./.corral/")] == ["./.corral/bootstrap.json"]
    # what was left out is said on stderr
    assert "old-home" in res.stderr and ".corral" in res.stderr and "runs.db" in res.stderr


def test_workspace_inside_corral_home_is_refused(
    cli_env: dict[str, str], corral_cmd: list[str], corral_home: Path
) -> None:
    res, _ = _corral(corral_cmd, cli_env, "run", "--", "echo", "earlier")
    assert res.returncode == 0, res.stderr
    res, _ = _corral(corral_cmd, cli_env, "run", "--workspace", str(corral_home / "journals"),
                     "--", "ls")
    assert res.returncode != 0
    assert "corral's own state" in res.stderr
    assert _sandboxes_left(corral_home) == []


# ------------------------------------------------------------------ size cap


def test_size_cap_stops_the_copy_and_names_the_limit(
    tmp_path: Path, cli_env: dict[str, str], corral_cmd: list[str], corral_home: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.bin").write_bytes(os.urandom(3 * MiB))
    env = {**cli_env, "CORRAL_MAX_COPY_SIZE": "1MiB"}
    res, _ = _corral(corral_cmd, env, "run", "--workspace", str(ws), "--", "true")
    assert res.returncode != 0
    last = res.stderr.strip().splitlines()[-1]
    assert "1 MiB" in last and "CORRAL_MAX_COPY_SIZE" in last and "max_copy_size" in last
    assert _sandboxes_left(corral_home) == []  # the half-made sandbox was destroyed


def test_size_cap_from_corral_toml_and_cli_flag(
    tmp_path: Path, cli_env: dict[str, str], corral_cmd: list[str]
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.bin").write_bytes(os.urandom(2 * MiB))
    (ws / "corral.toml").write_text('[workspace]\nmax_copy_size = "1MiB"\n')
    res, _ = _corral(corral_cmd, cli_env, "run", "--workspace", str(ws), "--", "true")
    assert res.returncode != 0
    assert "1 MiB" in res.stderr and "corral.toml" in res.stderr
    res, _ = _corral(corral_cmd, cli_env, "run", "--workspace", str(ws), "--max-copy-size",
                     "3MiB", "--", "stat", "-c", "%s", "/workspace/a.bin")
    assert res.returncode == 0, res.stderr
    assert str(2 * MiB) in res.stdout


# ------------------------------------------------------------------ symlinks


def test_symlinks_never_lead_the_copy_outside_the_workspace(
    tmp_path: Path, cli_env: dict[str, str], corral_cmd: list[str]
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("TOP-SECRET-OUTSIDE\n")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "file-link").symlink_to(outside / "secret.txt")
    (ws / "dir-link").symlink_to(outside)
    res, _ = _corral(
        corral_cmd, cli_env, "run", "--workspace", str(ws), "--",
        "sh", "-c", "cat /workspace/file-link /workspace/dir-link/secret.txt; "
                    "grep -r TOP-SECRET /workspace; readlink /workspace/file-link; true",
    )
    assert res.returncode == 0, res.stderr
    assert "TOP-SECRET" not in res.stdout
    assert str(outside / "secret.txt") in res.stdout  # kept as a link, not followed


# ------------------------------------------------------------------ progress (library)


def test_copy_reports_progress_to_a_callback(
    tmp_path: Path, corral_home: Path
) -> None:
    from corral.providers import get_provider
    from corral.sandbox._transfer import CopyProgress, copy_dir_into

    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    for i in range(20):
        (ws / "d" / f"f{i}.txt").write_bytes(b"x" * 1000)
    seen: list[CopyProgress] = []

    async def main() -> None:
        provider = get_provider("bubblewrap")
        handle = await provider.create()
        try:
            await copy_dir_into(handle, ws, progress=seen.append)
            assert len(await handle.fs.list("/workspace/d")) == 20
        finally:
            await provider.destroy(handle.ref)

    anyio.run(main)
    assert seen and seen[-1].done
    assert seen[-1].files_total == 20 and seen[-1].bytes_total == 20_000
    assert seen[-1].bytes_done == seen[-1].bytes_total
