"""Which modules a ``corral`` command imports (issue #17: a CLI whose commands import only what
they use). Behaviour, not timing: ``corral --version`` builds the parser from the command
table and imports no command module; ``corral ls`` and ``corral show`` open the store and
nothing more; none of them imports the runner, the harnesses, the providers or the HTTP, MCP
or AG-UI stacks. A command's parser is declared when it is used
(:class:`corral.cli._main.CommandParser`), by :mod:`corral.cli._arguments`, which imports no
command's work: a command's help, its usage errors and ``corral completion`` (every command
declared) import no command module at all. The help a late parser prints is checked against
parsers declared at once."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import corral
import corral.cli
from corral.cli._main import COMMANDS, CommandParser, Handler, build_parser

SRC = Path(corral.__file__).parent.parent

# third-party stacks that only running, serving or driving a run needs
HEAVY = ("pydantic", "httpx", "fastapi", "starlette", "uvicorn", "mcp", "ag_ui")

PROBE = """
import json, sys
from corral.cli._main import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def _modules_of(argv: list[str], home: Path, code: int = 0) -> set[str]:
    """The modules loaded by a fresh interpreter that ran ``corral ARGV`` (exit ``code``)."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "CORRAL_HOME": str(home)}
    env.pop("CORRAL_STORE", None)
    out = subprocess.run([sys.executable, "-c", PROBE, *argv], env=env, capture_output=True,
                         text=True, timeout=120, check=False)
    report = json.loads(out.stderr.strip().splitlines()[-1])
    assert report["code"] in ((0, None) if code == 0 else (code,)), out
    return set(report["modules"])


def _corral(modules: set[str]) -> set[str]:
    return {m for m in modules if m == "corral" or m.startswith("corral.")}


def _heavy(modules: set[str]) -> set[str]:
    return {m for m in modules if m.split(".")[0] in HEAVY}


def _outside(modules: set[str], allowed: tuple[str, ...]) -> set[str]:
    """Corral modules not in ``allowed`` (a name ending in ``.`` allows the whole package)."""
    return {m for m in _corral(modules)
            if not any(m == a or (a.endswith(".") and m.startswith(a)) for a in allowed)}


# what the parser itself needs: the bottom modules, the command table, the one-line error
# report (corral._cmdline); no command module
PARSER = ("corral", "corral._cmdline", "corral._durations", "corral._errors", "corral._lazy",
          "corral._paths", "corral._version", "corral.cli", "corral.cli._main")


def test_version_imports_the_parser_only(tmp_path: Path) -> None:
    modules = _modules_of(["--version"], tmp_path)
    assert _outside(modules, PARSER) == set()
    assert _heavy(modules) == set()
    assert "anyio" not in modules and "sqlite3" not in modules
    assert "psycopg" not in modules
    assert "rich" not in modules  # progress display: agents install and images build only


@pytest.mark.parametrize("argv", [["ls"], ["ls", "--json", "--status", "running"]])
def test_ls_imports_the_store_layer_only(tmp_path: Path, argv: list[str]) -> None:
    modules = _modules_of(argv, tmp_path)  # the first: it creates the store
    store_side = (*PARSER, "corral._log", "corral.cli._arguments", "corral.cli._records",
                  "corral.cli._store", "corral.stores", "corral.stores.",
                  "corral._ids")  # the checkpoint tables' id rule (the store opened whole)
    assert _outside(modules, store_side) == set()
    assert _heavy(modules) == set() and "rich" not in modules
    for never in ("corral.runs._runner", "corral.harness", "corral.providers",
                  "corral.sandbox", "corral.journal", "corral.tools", "corral.agents",
                  "corral.stores._postgres", "psycopg", "psycopg_pool"):
        assert never not in modules  # a SQLite store never loads the PostgreSQL driver
    assert "corral.stores._sqlite" in modules
    # the store exists now: it is read with sqlite3 alone, no event loop, no store object
    again = _modules_of(argv, tmp_path)
    assert _outside(again, (*PARSER, "corral.cli._arguments", "corral.cli._records",
                            "corral.stores",
                            "corral.stores._records", "corral.stores._url",
                            "corral.stores._sqlite_tables")) == set()
    assert {"anyio", "asyncio", "corral.stores._sqlite"} & again == set()


# what declaring commands needs beyond the parser: the declarations, and the constants they
# print (the default provider, run statuses, the agents, the reaper's and the server's
# defaults)
DECLARED = (*PARSER, "corral.cli._arguments", "corral._suggest", "corral.sandbox",
            "corral.sandbox._contracts", "corral.journal", "corral.journal._sentinel",
            "corral.stores", "corral.stores._records", "corral.harness",
            "corral.harness._packages", "corral.runs", "corral.runs._reap_limits",
            "corral.server", "corral.server._serve_cli", "corral.server._config")


@pytest.mark.parametrize("argv, code", [
    (["run", "--help"], 0),
    (["run", "--no-such-option"], 2),  # a usage error
    (["exec", "--timeout", "soon", "--", "true"], 2),
    (["serve", "--help"], 0),
    (["threads", "fork", "t"], 2),  # a subcommand's missing option
    (["completion", "bash"], 0),
    (["completion", "fish"], 0),
])
def test_help_usage_errors_and_completion_import_no_work(
        tmp_path: Path, argv: list[str], code: int) -> None:
    """A command's help, its usage errors and ``corral completion`` (which declares every
    command: a shell evaluates it at start-up) import the declarations alone: no command
    module, no runner, provider, store, server or event loop, nothing outside the standard
    library."""
    modules = _modules_of(argv, tmp_path, code)
    allowed = (*DECLARED, "corral.cli._completion") if argv[0] == "completion" else DECLARED
    assert _outside(modules, allowed) == set()
    third_party = {m.split(".")[0] for m in modules} - set(sys.stdlib_module_names)
    assert {m for m in third_party if not m.startswith("_") and m != "corral"} == set()
    for never in ("pydantic", "anyio", "corral.runs._runner", "corral.runs._reap_sweep",
                  "corral.providers", "corral.server._serve", "corral.server._app",
                  "corral.sandbox._definition", "corral.cli._run", "corral.cli._exec"):
        assert never not in modules


def test_show_of_a_missing_run_is_one_line_without_the_runner(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC), "CORRAL_HOME": str(tmp_path)}
    env.pop("CORRAL_STORE", None)
    code = PROBE.replace("from corral.cli._main import main",
                         "from corral.cli._main import main\nsys.argv[1:] = ['show', 'nope']")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    first, last = out.stderr.strip().splitlines()
    assert first.startswith("corral: error: ") and "nope" in first
    report = json.loads(last)
    assert report["code"] == 2
    assert "corral.runs._runner" not in report["modules"] and not _heavy(set(report["modules"]))


def test_the_public_face_stays_lazy() -> None:
    code = ("import json, sys, corral\ncorral.__version__\n"
            "print(json.dumps([m for m in sys.modules if m.startswith('corral.')]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(SRC)}, check=True)
    assert set(json.loads(out.stdout)) <= {
        "corral._errors", "corral._lazy", "corral._version"}


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
              ) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every (sub)command parser under ``parser``, depth first, with its words (each command
    declared, as ``corral completion`` does)."""
    if isinstance(parser, CommandParser):
        parser.declare()
    found = [(path, parser)]
    for action in parser._actions:  # noqa: SLF001 - argparse has no public walk
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, sub in action.choices.items():
                found += _commands(sub, (*path, name))
    return found


def test_late_arguments_print_and_parse_as_eager_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    late, eager = dict(_commands(build_parser())), dict(_commands(build_parser(eager=True)))
    assert late.keys() == eager.keys() and len(late) > 15
    for words, parser in late.items():
        assert parser.format_help() == eager[words].format_help(), words
    argv = ["ls", "--status", "running", "--limit", "3", "--json"]
    assert vars(build_parser().parse_args(argv)).keys() == vars(
        build_parser(eager=True).parse_args(argv)).keys()


def test_the_table_is_every_command_and_only_the_chosen_one_is_declared() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
    assert list(sub.choices) == list(COMMANDS)
    parser.parse_args(["ls"])
    declared = {name for name, p in sub.choices.items() if p._actions[1:]}  # noqa: SLF001
    assert declared == {"ls"}  # the others hold only -h: their modules are not imported


def test_every_cli_module_imports() -> None:
    # A command module is imported only when its command is used: a broken one must fail
    # here, not only when someone runs that command.
    names = [m.name for m in pkgutil.iter_modules(corral.cli.__path__)]
    assert {"_main", "_exec", "_run", "_view", "_records", "_doctor"} <= set(names)
    for name in names:
        importlib.import_module(f"corral.cli.{name}")
    for command in COMMANDS.values():
        module, _, function = command.arguments.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), command
    # and every handler a declaration names (imported only when its command runs)
    handlers = [p.get_default("func") for _, p in _commands(build_parser(eager=True))]
    named = [h for h in handlers if isinstance(h, Handler)]
    assert len(named) > 20
    for handler in named:
        assert callable(handler.resolve()), handler


TICKER = "i=0; while [ $i -lt 30 ]; do echo tick $i; i=$((i+1)); sleep 0.05; done"


def test_taking_over_a_command_run_imports_no_agent_cli_stack(tmp_path: Path) -> None:
    """``corral attach`` of a command run whose driver was SIGKILLed takes the run over and
    drives it to its end without the agent-CLI stack (adapters, sessions, model proxy,
    httpx), the tool servers or the AG-UI models: what its start-up (issue #17) must not
    pay for."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "CORRAL_HOME": str(tmp_path),
           "CORRAL_STORE": f"sqlite://{tmp_path}/runs.db"}
    driver = subprocess.Popen(
        [sys.executable, "-m", "corral", "run", "--provider", "local", "--run-id", "take",
         "--json", "--", "sh", "-c", TICKER],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert driver.stdout is not None
    try:
        last = -1
        for _ in range(3):
            line = driver.stdout.readline()
            assert line, driver.stderr.read() if driver.stderr else ""
            last = json.loads(line)["offset"]
    finally:
        driver.kill()
        driver.wait()
    out = subprocess.run([sys.executable, "-c", PROBE, "attach", "take", "--after", str(last),
                          "--json"], env=env, capture_output=True, text=True, timeout=120,
                         check=False)
    report = json.loads(out.stderr.strip().splitlines()[-1])
    assert report["code"] == 0, out  # it drove the run to its end: completed
    events = [json.loads(x)["event"] for x in out.stdout.splitlines()]
    assert events[-1]["type"] == "RUN_FINISHED" and "tick 29" in "".join(
        e.get("delta", "") for e in events)
    modules = set(report["modules"])
    assert "corral.runs._runner" in modules and "corral.harness._command" in modules
    never = ("corral.agents._prepare", "corral.harness._cli_base", "corral.harness._events",
             "corral.runs._launch", "corral.runs._keep_services", "corral.net._model_proxy",
             "corral.tools._approvals", "corral.tools._mcp_server")
    assert {m for m in never if m in modules} == set()
    assert {m for m in _heavy(modules) if m.split(".")[0] != "pydantic"} == set()
