"""README's Python quick start runs as written: the block is extracted from README.md and
executed verbatim in a fresh interpreter with a private ``$CORRAL_HOME``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## Python quick start"

pytestmark = pytest.mark.usefixtures("need_bwrap_runs")


def quick_start() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```python\n(.*?)^```$", section, flags=re.DOTALL | re.MULTILINE)
    assert len(blocks) == 1, f"{SECTION} should hold exactly one python block"
    return str(blocks[0])


def test_the_quick_start_uses_public_names_only() -> None:
    imports = re.findall(r"^\s*(?:from|import) (\S+)", quick_start(), flags=re.MULTILINE)
    assert imports and set(imports) <= {"anyio", "corral"}, imports


def test_the_python_quick_start_runs_as_written(tmp_path: Path, cli_env: dict[str, str]) -> None:
    script = tmp_path / "quick_start.py"
    script.write_text(quick_start())
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=cli_env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert re.fullmatch(r"started run-[0-9a-f]+", lines[0]), lines
    events = [line.split(" ", 2) for line in lines[1:-1]]
    offsets = [int(e[0]) for e in events]
    assert offsets == list(range(1, len(events) + 1)), lines  # every event, in log order
    assert events[0][1] == "RUN_STARTED" and events[-1][1] == "RUN_ERROR", lines
    ticks = [e[2] for e in events if e[1] == "TEXT_MESSAGE_CONTENT"]
    assert "\n".join(ticks).startswith("tick 1\ntick 2\ntick 3"), ticks
    assert lines[-1] == "status aborted", lines
    # The cancel destroyed the run's sandbox: nothing is left in this CORRAL_HOME.
    left = subprocess.run([sys.executable, "-m", "corral", "sandboxes", "ls", "--json"],
                          env=cli_env, capture_output=True, text=True, timeout=60)
    assert left.returncode == 0, left.stderr
    assert left.stdout == "[]\n"  # one JSON document: an empty array
