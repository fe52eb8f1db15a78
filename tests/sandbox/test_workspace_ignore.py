"""``corral run --workspace DIR`` leaves out what DIR's ``.gitignore`` and ``.corralignore``
files exclude, and ``.git`` (issue #31, item 9); ``--no-ignore`` copies everything; one line
says what is copied and how big. The ignore files come from the workspace, which may be
hostile: they can only leave files out, and the workspace's git configuration never runs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.sandbox._copyguard import StateGuard
from corral.sandbox._ignore import kept_files
from corral.sandbox._transfer import _walk

LIST = ["sh", "-c", "find . -path ./.corral -prune -o -print | sort"]


def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


def _tree(root: Path) -> None:
    (root / ".git" / "objects").mkdir(parents=True)
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / ".gitignore").write_text(".venv/\n*.log\n!keep.log\n")
    (root / "a.txt").write_text("a\n")
    (root / "b.log").write_text("b\n")
    (root / "keep.log").write_text("k\n")
    (root / ".venv" / "lib").mkdir(parents=True)
    (root / ".venv" / "lib" / "big").write_bytes(b"x" * 4096)
    (root / "sub").mkdir()
    (root / "sub" / "s.txt").write_text("s\n")
    (root / "sub" / "t.txt").write_text("t\n")
    (root / "sub" / ".corralignore").write_text("s.txt\n")


@pytest.mark.usefixtures("need_bwrap_runs")
def test_run_workspace_honours_gitignore_and_corralignore(
    tmp_path: Path, corral_cmd: list[str], cli_env: dict[str, str]
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    _tree(ws)
    out = run([*corral_cmd, "run", "--workspace", str(ws), "--", *LIST], cli_env)
    assert out.returncode == 0, out.stderr
    assert out.stdout == (".\n./.gitignore\n./a.txt\n./keep.log\n./sub\n./sub/.corralignore\n"
                          "./sub/t.txt\n")
    first = out.stderr.splitlines(keepends=True)[0]
    assert first == (f"corral: copying {ws} into the sandbox (35 B in 5 files; .gitignore and "
                     ".corralignore honoured, --no-ignore copies everything)\n")
    everything = run([*corral_cmd, "run", "--no-ignore", "--workspace", str(ws), "--",
                      "sh", "-c", "ls -a | sort"], cli_env)
    assert everything.returncode == 0, everything.stderr
    assert everything.stdout == ".\n..\n.corral\n.git\n.gitignore\n.venv\na.txt\nb.log\nkeep.log\nsub\n"
    assert everything.stderr.splitlines(keepends=True)[0] == (
        f"corral: copying {ws} into the sandbox (4.1 KiB in 9 files)\n")


@pytest.mark.usefixtures("need_bwrap_runs")
def test_hostile_ignore_files_cannot_bring_in_outside_files_or_run_git_config(
    tmp_path: Path, corral_cmd: list[str], cli_env: dict[str, str]
) -> None:
    (tmp_path / "outside.txt").write_text("secret\n")
    ws = tmp_path / "ws"
    (ws / ".git").mkdir(parents=True)
    pwned = tmp_path / "pwned"
    # a repository whose config runs a command when git refreshes its index
    (ws / ".git" / "config").write_text(
        f"[core]\n\tfsmonitor = touch {pwned}\n\thooksPath = /nonexistent\n")
    (ws / ".gitignore").write_text("*\n!a.txt\n!../outside.txt\n!/../outside.txt\n!/etc/passwd\n")
    (ws / ".corralignore").write_text("!../*\n!/proc/self/environ\n")
    (ws / "a.txt").write_text("a\n")
    (ws / "b.txt").write_text("b\n")
    out = run([*corral_cmd, "run", "--workspace", str(ws), "--",
               "sh", "-c", "find / -name outside.txt 2>/dev/null; "
                           "find . -path ./.corral -prune -o -type f -print | sort"], cli_env)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "./a.txt\n"  # "*" even leaves out the ignore files themselves
    assert not pwned.exists()


def _git_ignored(root: Path, paths: list[str]) -> set[str]:
    if not paths:
        return set()
    out = subprocess.run(["git", "check-ignore", "--no-index", "-z", "--stdin"], cwd=root,
                         input="\0".join(paths).encode(), capture_output=True, check=False,
                         env={**os.environ, "GIT_CONFIG_GLOBAL": os.devnull,
                              "GIT_CONFIG_NOSYSTEM": "1"})
    return {p for p in out.stdout.decode().split("\0") if p}


NAMES = st.sampled_from(["a", "b", "a.log", "x.txt", "dir", "Dir", "n m"])
PATTERNS = st.sampled_from(["*.log", "a", "/a", "dir/", "dir", "!a.log", "*", "!x.txt",
                            "d*/", "**/x.txt", "dir/**", "!dir/", "# c", "", "a\\ ", "n m",
                            "[ab]", "?", "!*.txt", "/dir/a"])


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.lists(st.lists(NAMES, min_size=1, max_size=3), min_size=1, max_size=8),
       top=st.lists(PATTERNS, max_size=4), nested=st.lists(PATTERNS, max_size=3))
def test_what_is_copied_is_what_git_does_not_ignore(
    tmp_path_factory: pytest.TempPathFactory, files: list[list[str]], top: list[str],
    nested: list[str],
) -> None:
    root = tmp_path_factory.mktemp("ws")
    subprocess.run(["git", "init", "-q", str(root)], check=True, capture_output=True)
    made: list[str] = []
    for parts in files:
        path = root.joinpath(*parts)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                path.write_text("x")
                made.append("/".join(parts))
        except (FileExistsError, NotADirectoryError, IsADirectoryError):
            continue  # a name used both as a file and a directory
    (root / ".gitignore").write_text("\n".join(top) + "\n")
    made.append(".gitignore")
    if (root / "dir").is_dir():
        (root / "dir" / ".gitignore").write_text("\n".join(nested) + "\n")
        made.append("dir/.gitignore")
    kept = kept_files(root)
    copied = {e.rel for e in _walk(str(root), (), StateGuard.current(), kept)
              if e.kind in ("file", "link")}
    want = set(made) - _git_ignored(root, made)
    assert copied == want
