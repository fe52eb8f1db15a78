"""Conventions a CLI user expects (issue #31, item 12): help for every option, commands
grouped by task, shell completion, "did you mean", a global -v/--log-level, a library that
never prints on its own, a permission problem called that."""

from __future__ import annotations

import argparse
import errno
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from corral._paths import describe_os_error, storage_problem
from corral.cli._main import COMMAND_GROUPS, build_parser


def run(argv: list[str], env: dict[str, str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, **kw)  # type: ignore[call-overload, no-any-return]


def _actions(parser: argparse.ArgumentParser, path: str):  # type: ignore[no-untyped-def]
    complete = getattr(parser, "_complete", None)
    if complete is not None:
        complete()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield f"{path} {name}", name, helps.get(name)
                yield from _actions(sub, f"{path} {name}")
        else:
            yield path, "/".join(action.option_strings) or action.dest, action.help


def test_every_command_option_and_positional_has_help() -> None:
    missing = [f"{path}: {name}" for path, name, help_ in _actions(build_parser(), "corral")
               if not help_ or help_ == argparse.SUPPRESS]
    assert missing == []


def test_help_groups_the_commands_by_task(corral_cmd: list[str], cli_env: dict[str, str]) -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    grouped = [name for _, names in COMMAND_GROUPS for name in names]
    assert sorted(grouped) == sorted(sub.choices)  # every command once
    out = run([*corral_cmd, "--help"], cli_env)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.startswith("usage: corral [-h] [--version] [-v] [--log-level {debug,info,warning,error}]")
    assert "positional arguments" not in text
    starts = [text.index(f"\n{title}:\n") for title, _ in COMMAND_GROUPS]
    assert starts == sorted(starts)
    runs = text.split("\nRuns:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert [line.split()[0] for line in runs] == ["run", "attach", "cancel", "ls", "show", "approve",
                                                  "threads"]
    assert "  run         start a durable run and stream its events\n" in text
    assert text.endswith("\nRun 'corral COMMAND --help' for a command's options.\n")


BASH_PROBE = r"""
set -e
eval "$(corral completion bash)"
t() { COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); COMPREPLY=(); _corral; echo "${COMPREPLY[*]}"; }
t corral sa
t corral sandboxes ""
t corral sandboxes ls --a
t corral ls --status r
t corral --log-level debug sh
t corral run --thread ls --js
t corral completion ""
t corral exec -- l
"""


def test_bash_completion_completes_commands_options_and_choices(
    corral_cmd: list[str], cli_env: dict[str, str], tmp_path: Path
) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shim = bindir / "corral"
    shim.write_text(f"#!/bin/sh\nexec {' '.join(corral_cmd)} \"$@\"\n")
    shim.chmod(0o755)
    env = {**cli_env, "PATH": f"{bindir}{os.pathsep}{cli_env['PATH']}"}
    out = run(["bash", "-c", BASH_PROBE], env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout == ("sandboxes\n"
                          "ls prune rm\n"
                          "--all-stores\n"
                          "running\n"
                          "show\n"
                          "--json\n"  # --thread's value `ls` is not taken for the command
                          "bash fish zsh\n"
                          "\n")  # after --: the sandboxed command's words are its own


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_completion_scripts(shell: str, corral_cmd: list[str],
                                         cli_env: dict[str, str], tmp_path: Path) -> None:
    out = run([*corral_cmd, "completion", shell], cli_env)
    assert out.returncode == 0 and out.stderr == ""
    if shell == "fish":
        assert "complete -c corral -f -n '__corral_at corral' -a run -d 'start a durable run and stream its events'\n" in out.stdout
        assert "complete -c corral -n '__corral_at '\"'\"'corral ls'\"'\"'' -l status -x -a " in out.stdout
    else:
        assert "bashcompinit\n" in out.stdout and "complete -F _corral corral\n" in out.stdout
    binary = shutil.which(shell)
    if binary is not None:  # where the shell is installed, it parses the script
        script = tmp_path / f"corral.{shell}"
        script.write_text(out.stdout)
        check = run([binary, "-n", str(script)], cli_env)
        assert check.returncode == 0, check.stderr


def test_an_unknown_provider_or_key_suggests_the_close_one(
    corral_cmd: list[str], cli_env: dict[str, str], tmp_path: Path
) -> None:
    out = run([*corral_cmd, "exec", "--provider", "dokcer", "--", "true"], cli_env)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("corral: error: unknown provider 'dokcer' (did you mean 'docker'?): ")
    assert out.stderr.endswith("known providers: bubblewrap, docker, local\n")
    assert out.stderr.count("\n") == 1
    config = tmp_path / "c.toml"
    config.write_text('[workspace]\nsteup = ["make"]\n')
    out = run([*corral_cmd, "run", "--config", str(config), "--", "true"], cli_env)
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == (f"corral: error: {config}:2: unknown key 'workspace.steup' (did you "
                          "mean 'setup'?); known keys: instructions, max_copy_size, scripts, "
                          "setup, source\n")


def test_global_log_level_is_parsed_before_the_command() -> None:
    from corral.cli._main import log_level

    parse = build_parser().parse_args
    assert log_level(parse(["ls"])) is None
    assert log_level(parse(["-v", "ls"])) == "info"
    assert log_level(parse(["-vv", "ls"])) == "debug"
    assert log_level(parse(["--log-level", "error", "ls"])) == "error"
    serve = parse(["--log-level", "debug", "serve"])
    from corral.cli._main import _configure_logging

    _configure_logging(serve)  # the global level reaches serve's own
    assert serve.log_level == "debug"


FIFO_RUN = """
import os, sys, anyio
from corral import LocalDir, Lifecycle, RunRequest, Runner, Sandbox, Workspace, open_store

async def main() -> None:
    store = await open_store()
    try:
        runner = Runner(store)
        sandbox = Sandbox(provider="bubblewrap", workspace=Workspace(source=LocalDir(sys.argv[1])),
                          lifecycle=Lifecycle(reuse="none"))
        record = await runner.start(RunRequest(command=["true"], sandbox=sandbox))
        await runner.drive(record.run_id)
        final = await store.get(record.run_id)
        assert final is not None and final.status.value == "completed", final
    finally:
        await store.aclose()

anyio.run(main)
"""


@pytest.mark.usefixtures("need_bwrap_runs")
def test_the_library_never_prints_and_the_cli_logs_in_one_format(
    tmp_path: Path, corral_cmd: list[str], cli_env: dict[str, str]
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "a.txt").write_text("a\n")
    (workspace / "corral.db").write_text("")  # not copied: corral logs a warning about it
    script = tmp_path / "plain.py"
    script.write_text(textwrap.dedent(FIFO_RUN))
    out = run([sys.executable, str(script), str(workspace)], cli_env)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""  # no warning through logging's last-resort handler
    # (the same script with logging configured does log the warning: the path is real)
    logged = script.with_name("logged.py")
    logged.write_text("import logging\nlogging.basicConfig()\n" + script.read_text())
    out = run([sys.executable, str(logged), str(workspace)], cli_env)
    assert out.returncode == 0 and "WARNING:corral.sandbox._transfer:not copying " in out.stderr
    # the command line shows that warning, in its format; -v adds the info lines
    quiet = run([*corral_cmd, "run", "--workspace", str(workspace), "--", "true"], cli_env)
    assert quiet.returncode == 0, quiet.stderr
    warning = (f"corral: WARNING corral.sandbox._transfer: not copying "
               f"{workspace / 'corral.db'} into the sandbox: it looks like a corral run store\n")
    assert warning in quiet.stderr and "corral: INFO " not in quiet.stderr
    loud = run([*corral_cmd, "-v", "run", "--workspace", str(workspace), "--", "true"], cli_env)
    assert loud.returncode == 0, loud.stderr
    assert warning in loud.stderr and "\ncorral: INFO corral.sandbox._transfer: copying " in loud.stderr


def test_permission_denied_is_not_called_full(tmp_path: Path) -> None:
    # procfs (like btrfs for inodes) counts nothing: its zeros do not mean "full"
    assert storage_problem("/proc/self") is None
    home = str(tmp_path)
    denied = PermissionError(errno.EACCES, "Permission denied", "/proc/corral-home/corral.db")
    assert describe_os_error(denied) == ("/proc/corral-home/corral.db: permission denied; fix "
                                         "its owner or mode")
    mine = PermissionError(errno.EACCES, "Permission denied", os.path.join(home, "corral.db"))
    os.environ["CORRAL_HOME"], old = home, os.environ.get("CORRAL_HOME")
    try:
        assert describe_os_error(mine) == (f"{home}/corral.db: permission denied; fix its owner "
                                           "or mode, or set CORRAL_HOME to another directory")
    finally:
        if old is None:
            del os.environ["CORRAL_HOME"]
        else:
            os.environ["CORRAL_HOME"] = old
