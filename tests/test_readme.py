"""README's Python quick start runs as written: the block is extracted from README.md and
executed verbatim in a fresh interpreter with a private ``$CORRAL_HOME``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
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


# --- the README's ```sh blocks ---------------------------------------------------------------
#
# Every command line of every ```sh block is either run here, verbatim, from a directory that
# looks like the checkout (its .venv, examples/, a Makefile for `make`), with a fresh
# $CORRAL_HOME, or listed in SKIPPED with the reason. A new README line that is neither
# fails test_every_readme_command_is_run_or_skipped_with_a_reason.

SKIPPED = {
    '$( [ "$(id -u)" = 0 ] || echo sudo ) apt-get install -y bubblewrap git python3-venv':
        "installs Debian packages (the test host has them: need_bwrap_runs)",
    "python3 -m venv .venv": "the venv exists: the tests run in it",
    ".venv/bin/pip install -e .": "the venv has corral installed (editable)",
    ".venv/bin/corral agents install claude-code":
        "a 466 MB npm download: tests/agents/test_installs.py installs every CLI",
    'ANTHROPIC_API_KEY=… .venv/bin/corral run --harness claude-code --thread T "fix the '
    'failing test"': "needs a model key: tests/agents/test_e2e.py runs it against a "
                     "scripted model server",
    'ANTHROPIC_API_KEY=… .venv/bin/corral run --harness acp --agent claude "fix it"':
        "needs a model key: tests/agents/test_acp_agents.py",
    ".venv/bin/corral serve --port 8080": "a server that runs until stopped: tests/server",
    ".venv/bin/corral approve RUN_ID APPROVAL_ID --allow":
        "needs a host tool's pending approval: tests/tools",
    "bash scripts/test.sh": "the whole suite, this test included",
    'ANTHROPIC_API_KEY=… .venv/bin/corral run --harness claude-code --output-schema '
    'result.json "triage the bug"': "needs a model key: tests/agents/"
                                    "test_structured_output.py",
    ".venv/bin/corral acp --harness claude-code": "an ACP agent on stdio for an editor: "
                                                  "tests/server/test_acp_agent.py",
    ".venv/bin/corral mcp": "an MCP server on stdio: tests/server/test_mcp_tools.py",
}

RUN_LINE = re.compile(r"run-[0-9a-f]{20}")
CompletedProcess = subprocess.CompletedProcess[str]


def readme_commands() -> list[str]:
    """Every command of the README's ```sh blocks, in order, without its comment; the
    quick start's `a && b && c` is its parts."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"^```sh\n(.*?)^```$", text, flags=re.DOTALL | re.MULTILINE)
    out: list[str] = []
    for block in blocks:
        for line in block.splitlines():
            command = re.sub(r"\s+# .*$", "", line).strip()
            if command:
                out.extend(part.strip() for part in command.split(" && "))
    return out


class Checkout:
    """A directory laid out like the checkout, and the README's commands run from it."""

    def __init__(self, path: Path, env: dict[str, str]) -> None:
        self.path, self.env = path, env
        self.values: dict[str, str] = {}

    def sh(self, command: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        for name, value in self.values.items():
            command = re.sub(rf"\b{name}\b", value, command)
        out = subprocess.run(["bash", "-c", command], cwd=self.path, env=self.env,
                             capture_output=True, text=True, timeout=timeout, check=False)
        assert "Traceback" not in out.stderr, (command, out.stderr)
        return out


def _summary(out: subprocess.CompletedProcess[str], status: str, code: int) -> str:
    """The run id of the human stream's closing line (`corral: run X <status> (exit N, …)`)."""
    last = out.stderr.splitlines()[-1]
    m = re.fullmatch(rf"corral: run ({RUN_LINE.pattern}) {status} \(exit {code}, .*\)", last)
    assert m, out.stderr
    return m.group(1)


def _quick_start(c: Checkout, out: subprocess.CompletedProcess[str]) -> None:
    assert out.returncode == 0, out.stderr
    assert out.stdout == "notes.txt: 11 words\npoem.txt: 12 words\ndone\n"
    c.values["RUN_ID"] = _summary(out, "completed", 0)


def _ls(c: Checkout, out: subprocess.CompletedProcess[str]) -> None:
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and lines[0].split()[:3] == ["RUN_ID", "THREAD", "STATUS"]
    assert lines[1].startswith(c.values["RUN_ID"]) and " completed " in lines[1], lines


def _attach(c: Checkout, out: subprocess.CompletedProcess[str]) -> None:
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [e["offset"] for e in lines] == list(range(1, len(lines) + 1))
    assert lines[0]["event"]["type"] == "RUN_STARTED"
    assert lines[-1]["event"]["type"] == "RUN_FINISHED"


def _cancel(c: Checkout, out: subprocess.CompletedProcess[str]) -> None:
    assert out.returncode == 0, out.stderr  # a finished run: nothing to do, said so
    assert out.stderr == f"corral: run {c.values['RUN_ID']}: completed\n"


def _show(c: Checkout, out: subprocess.CompletedProcess[str]) -> None:
    record = json.loads(out.stdout)
    assert out.returncode == 0 and record["run_id"] == c.values["RUN_ID"]
    assert (record["status"], record["exit_code"]) == ("completed", 0)


def _exec(c: Checkout, out: subprocess.CompletedProcess[str]) -> None:
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("uid=") and "\nworkspace\n" in out.stdout, out.stdout


def _detach(c: Checkout, out: subprocess.CompletedProcess[str]) -> None:
    assert out.returncode == 0 and RUN_LINE.fullmatch(out.stdout.strip()), out
    c.values["DETACHED"] = out.stdout.strip()


def _make_without_a_workspace(target: str) -> Callable[[Checkout, CompletedProcess], None]:
    # No --workspace: an empty /workspace, so make has no Makefile. The line is still a
    # valid corral command: the run starts and ends with make's own exit status.
    def check(c: Checkout, out: subprocess.CompletedProcess[str]) -> None:
        assert out.returncode == 2, out.stderr
        assert f"No rule to make target '{target}'" in out.stderr
        _summary(out, "failed", 2)
    return check


def _make_in_the_checkout(c: Checkout, out: subprocess.CompletedProcess[str]) -> None:
    assert out.returncode == 0 and out.stdout == "echo made\nmade\n", out
    _summary(out, "completed", 0)


def _reap(c: Checkout, out: subprocess.CompletedProcess[str]) -> None:
    doc = json.loads(out.stdout)  # one document
    assert out.returncode == 0 and {"considered", "outcomes", "runs"} <= set(doc), doc


def _gc(c: Checkout, out: subprocess.CompletedProcess[str]) -> None:
    assert out.returncode == 0 and out.stdout == "gc: nothing idle\n", out


def _sandboxes_ls(c: Checkout, out: subprocess.CompletedProcess[str]) -> None:
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and lines[0].split()[:2] == ["ID", "PROVIDER"], lines
    assert any(line.startswith(c.values["ID"] + " ") for line in lines[1:]), lines


def _prune(c: Checkout, out: subprocess.CompletedProcess[str]) -> None:
    assert out.returncode == 0, out.stderr  # what it lists depends on the machine's homes
    assert out.stderr.splitlines()[-1].startswith("corral: would remove "), out.stderr


def _threads_ls(c: Checkout, out: subprocess.CompletedProcess[str]) -> None:
    # every run is a turn of a thread (its own, when none is named): the quick start's too
    assert out.returncode == 0, out.stderr
    header, *rows = out.stdout.splitlines()
    assert header.split()[:3] == ["THREAD", "RUNS", "LAST"], out.stdout
    assert any(row.endswith("python3 count.py") for row in rows), out.stdout


def _sandboxes_rm(c: Checkout, out: subprocess.CompletedProcess[str]) -> None:
    assert out.returncode == 0, out.stderr
    left = c.sh(".venv/bin/corral sandboxes ls --json")
    assert c.values["ID"] not in left.stdout, left.stdout


RUN: dict[str, Callable[[Checkout, CompletedProcess], None]] = {
    ".venv/bin/corral run --workspace examples/hello -- python3 count.py": _quick_start,
    ".venv/bin/corral ls": _ls,
    ".venv/bin/corral attach RUN_ID --json": _attach,
    ".venv/bin/corral cancel RUN_ID": _cancel,
    ".venv/bin/corral show RUN_ID --json": _show,
    ".venv/bin/corral exec -- sh -c 'id; ls /'": _exec,
    ".venv/bin/corral run --detach -- make test": _detach,
    ".venv/bin/corral run --timeout 10m -- make test": _make_without_a_workspace("test"),
    ".venv/bin/corral run --file-events -- make build": _make_without_a_workspace("build"),
    ".venv/bin/corral run --workspace . --max-copy-size 4GiB -- make": _make_in_the_checkout,
    ".venv/bin/corral reap --ttl 1h --json": _reap,
    ".venv/bin/corral gc": _gc,
    ".venv/bin/corral sandboxes ls": _sandboxes_ls,
    ".venv/bin/corral sandboxes rm ID": _sandboxes_rm,
    ".venv/bin/corral agents prune --dry-run": _prune,
    ".venv/bin/corral threads ls": _threads_ls,
}


def test_every_readme_command_is_run_or_skipped_with_a_reason() -> None:
    commands = readme_commands()
    unknown = [c for c in commands if c not in RUN and c not in SKIPPED]
    assert not unknown, f"run these README commands in RUN, or list them in SKIPPED: {unknown}"
    gone = (set(RUN) | set(SKIPPED)) - set(commands)
    assert not gone, f"no longer in the README: {gone}"


def test_the_readme_commands_run_as_written(tmp_path: Path, cli_env: dict[str, str]) -> None:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    # the checkout's .venv (the one running these tests) and its examples
    (checkout / ".venv").symlink_to(Path(sys.prefix))
    (checkout / "examples").symlink_to(ROOT / "examples")
    (checkout / "Makefile").write_text("all:\n\techo made\n")
    c = Checkout(checkout, cli_env)
    for command in readme_commands():
        if command in SKIPPED:
            continue
        if command == ".venv/bin/corral sandboxes ls":  # one to list, and to remove next
            kept = c.sh(".venv/bin/corral exec --keep -- true")
            assert kept.returncode == 0, kept.stderr
            m = re.search(r"corral: kept sandbox (\S+) \(bubblewrap\)", kept.stderr)
            assert m, kept.stderr
            c.values["ID"] = m.group(1)
        RUN[command](c, c.sh(command))
    # the detached run went on meanwhile: follow it to its end, then nothing is left
    done = c.sh(f".venv/bin/corral attach {c.values['DETACHED']}")
    assert done.returncode == 2 and "No rule to make target 'test'" in done.stderr, done
    left = c.sh(".venv/bin/corral sandboxes ls --json")
    assert left.returncode == 0 and left.stdout == "[]\n", left
