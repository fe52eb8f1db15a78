"""``corral agents install`` shows its stages (issue #31, item 10): plain lines with each
stage's time when stderr is not a terminal, rich's ticking stages on a terminal (a real pty).
Real npm, installing the smallest pinned CLI into a private agents directory."""

from __future__ import annotations

import io
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.cli._progress import Stages
from corral.testing._plugin import require

NAME, VERSION, BIN = "gemini-cli", "0.61.0", "gemini"
STAGES = ["npm: resolving", "npm: downloading", "npm: installing", "npm: linking",
          f"checking {BIN} --version"]


@pytest.fixture
def agents_dir(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A private ``$CORRAL_AGENTS_DIR`` other users can enter (so no shared install)."""
    require(request.config, shutil.which("npm") is not None, "npm (Node.js)",
            "apt-get install nodejs npm")
    d = Path(tempfile.mkdtemp(prefix="corral-agents-", dir="/var/tmp"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_stages_are_plain_lines_off_a_terminal() -> None:
    out = io.StringIO()
    with Stages("building img", out, terminal=False) as stages:
        stages.stage("one")
        stages.stage("two")
    assert re.sub(r"\(\d+ s\)", "(N s)", out.getvalue()) == (
        "corral: building img: one (N s)\ncorral: building img: two (N s)\n")
    failed = io.StringIO()
    with pytest.raises(RuntimeError), Stages("x", failed, terminal=False) as stages:
        stages.stage("breaks")
        raise RuntimeError
    assert failed.getvalue() == ""  # a stage that failed is not reported done


def test_install_prints_one_line_per_stage_with_its_time(
        agents_dir: Path, cli_env: dict[str, str]) -> None:
    env = dict(cli_env, CORRAL_AGENTS_DIR=str(agents_dir))
    out = subprocess.run([sys.executable, "-m", "corral", "agents", "install", NAME], env=env,
                         capture_output=True, text=True, timeout=900, check=False)
    assert out.returncode == 0, out.stderr
    assert re.sub(r"\(\d+ s\)", "(N s)", out.stderr) == "".join(
        f"corral: installing {NAME} {VERSION}: {stage} (N s)\n" for stage in STAGES)
    assert out.stdout == f"{NAME} {VERSION} installed at {agents_dir / NAME / VERSION}\n"


def test_install_on_a_terminal_ticks_its_stages(
        agents_dir: Path, cli_env: dict[str, str]) -> None:
    env = dict(cli_env, CORRAL_AGENTS_DIR=str(agents_dir), TERM="xterm-256color")
    env.pop("NO_COLOR", None)
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "corral", "agents", "install", NAME,
                             "--force"], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    seen = b""
    try:
        while True:  # until the child's end closes the terminal (EIO) or EOF
            ready, _, _ = select.select([master], [], [], 600)
            assert ready, seen[-2000:]
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(master)
        assert proc.stdout is not None
        stdout = proc.stdout.read().decode()
        assert proc.wait(timeout=120) == 0, seen[-2000:]
    text = seen.decode("utf-8", "replace")
    assert stdout == f"{NAME} {VERSION} installed at {agents_dir / NAME / VERSION}\n"
    assert "\x1b[" in text  # drawn in place, not appended as lines
    for stage in STAGES:
        assert f"corral: installing {NAME} {VERSION}: {stage}" in text, text[-3000:]
    assert re.search(r"\d:\d\d:\d\d", text)  # the elapsed time
    assert "✓" in text  # finished stages are ticked
    spinner = set("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏")
    assert spinner & set(text), text[-3000:]  # the current stage spins
