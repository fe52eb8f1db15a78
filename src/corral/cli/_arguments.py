"""Every command's arguments: the functions :data:`corral.cli._main.COMMANDS` names.

They import no command's work: a command's handler is a :class:`~corral.cli._main.Handler`,
``"module:function"``, whose module is imported when the command runs. So ``corral X
--help``, a usage error and ``corral completion`` (which declares every command) import this
module and the few constants it prints, never the runner, the providers, the server or
pydantic (``tests/test_cli_imports.py``; docs/benchmarks.md measures them). A declaration
imports the constants it prints itself, not this module: ``corral ls`` declares ``ls``
alone and does not pay for ``run``'s default provider (its module is most of a declaration's
cost). ``corral serve``'s arguments are the server's
(:func:`corral.server._serve_cli.serve_arguments`), shared with ``python -m corral.server``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, Final

from corral._cmdline import add_store_option, duration_arg
from corral.cli._main import Handler

__all__ = [
    "DEFAULT_TTL",
    "SHELLS",
    "acp_arguments",
    "agents_arguments",
    "approve_arguments",
    "attach_arguments",
    "cancel_arguments",
    "completion_arguments",
    "doctor_arguments",
    "exec_arguments",
    "gc_arguments",
    "images_arguments",
    "ls_arguments",
    "mcp_arguments",
    "reap_arguments",
    "run_arguments",
    "sandboxes_arguments",
    "show_arguments",
    "threads_arguments",
]

DEFAULT_TTL: Final = "1h"
"""``corral reap --ttl``'s default."""

SHELLS: Final = ("bash", "zsh", "fish")
"""The shells ``corral completion`` writes a script for."""


# ---------------------------------------------------------------------------- runs


def run_arguments(p: argparse.ArgumentParser) -> None:
    """``corral run``'s parser."""
    from corral.sandbox._contracts import DEFAULT_PROVIDER

    p.description = (
        "Start a run in a fresh sandbox and stream its events until it ends. "
        "Ctrl-C detaches (the run goes on; `corral attach RUN_ID` to watch again); "
        "a second Ctrl-C within 2 s cancels it."
    )
    p.add_argument("--provider",
                   help=f"sandbox provider: {DEFAULT_PROVIDER} (default), docker or local")
    p.add_argument("--workspace", metavar="DIR",
                   help="directory copied into /workspace (without what its .gitignore "
                        "and .corralignore files exclude, and .git)")
    p.add_argument("--no-ignore", action="store_true",
                   help="copy the whole --workspace, ignored files and .git included")
    p.add_argument("--max-copy-size", metavar="SIZE",
                   help="most file contents to copy into /workspace, e.g. 4GiB (default: "
                        "[workspace] max_copy_size, $CORRAL_MAX_COPY_SIZE or 1GiB)")
    p.add_argument("--config", metavar="PATH",
                   help="sandbox definition file (default: corral.toml in the workspace "
                        "or the current directory, or their parents)")
    p.add_argument("--thread", metavar="T", help="thread id (default: the run id)")
    p.add_argument("--run-id", metavar="R", help="run id (default: generated)")
    p.add_argument("--harness", help="harness (default: [agent] harness in corral.toml, "
                                     "else command)")
    p.add_argument("--model", metavar="M", help="model for agent harnesses")
    p.add_argument("--agent", metavar="NAME",
                   help="--harness acp: the ACP agent (gemini, opencode, claude)")
    p.add_argument("--agent-command", metavar="CMD",
                   help="--harness acp: start this ACP agent instead (no sandbox policy)")
    p.add_argument("--timeout", type=duration_arg("--timeout"), metavar="DURATION",
                   help="stop the agent after this long, e.g. 90s, 10m, 1h30m (the run "
                        "fails, exit code 124)")
    p.add_argument("--file-events", nargs="?", const="on", choices=["on", "diff"],
                   help="log the agent's workspace changes as sandbox.file events "
                        "(--file-events diff: with patches)")
    p.add_argument("--max-output", metavar="SIZE",
                   help="stop the agent once its output passes this size (default 1GiB; "
                        "the journal lives on the host, outside the sandbox's disk quota)")
    p.add_argument("--token-budget", type=_positive(int), metavar="N",
                   help="agent harnesses: model tokens the run may use; model calls past "
                        "it are refused")
    p.add_argument("--output-schema", metavar="FILE",
                   help="agent harnesses: a JSON Schema file; the run's result is a JSON "
                        "object matching it (corral show --json, CUSTOM corral.output), "
                        "or the run fails")
    p.add_argument("--on-session-lost", choices=["continue", "fail"], default="continue",
                   help="agent harnesses, a turn of a thread that cannot continue the "
                        "thread's saved conversation: answer in a new one and warn "
                        "(continue, the default), or fail")
    add_store_option(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--detach", action="store_true", help="start, print the run id, return")
    p.add_argument("argv", nargs="*", metavar="COMMAND",
                   help="the command (after --), or the prompt for agent harnesses")
    p.set_defaults(func=Handler("corral.cli._run:run"))


def _positive(kind: Callable[[str], float]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"{text!r} must be more than 0")
        return value

    parse.__name__ = kind.__name__  # argparse names it in "invalid int value"
    return parse


def attach_arguments(p: argparse.ArgumentParser) -> None:
    """``corral attach``'s parser."""
    p.add_argument("run_id", metavar="RUN_ID", help="the run to follow")
    p.add_argument("--after", type=int, default=0, metavar="N",
                   help="print only events after log offset N")
    add_store_option(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=Handler("corral.cli._view:attach"))


def cancel_arguments(p: argparse.ArgumentParser) -> None:
    """``corral cancel``'s parser."""
    p.add_argument("run_id", metavar="RUN_ID", help="the run to cancel")
    add_store_option(p)
    p.add_argument("--json", action="store_true",
                   help="print the run's record as one JSON document")
    p.set_defaults(func=Handler("corral.cli._run:cancel"))


def ls_arguments(p: argparse.ArgumentParser) -> None:
    """``corral ls``' parser."""
    from corral.stores._records import RunStatus

    p.add_argument("--thread", metavar="T", help="only this thread's runs")
    p.add_argument("--status", choices=[s.value for s in RunStatus],
                   help="only runs in this status")
    p.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    add_store_option(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=Handler("corral.cli._records:ls"))


def show_arguments(p: argparse.ArgumentParser) -> None:
    """``corral show``'s parser."""
    p.add_argument("run_id", metavar="RUN_ID", help="the run to show")
    add_store_option(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=Handler("corral.cli._view:show"))


def approve_arguments(p: argparse.ArgumentParser) -> None:
    """``corral approve``'s parser."""
    p.description = ("Allow or deny a host tool call waiting for approval, or list them. "
                     "Approvals live in the store (--store, CORRAL_STORE): any host sharing "
                     "it can answer, wherever the run is driven.")
    p.add_argument("run_id", metavar="RUN_ID", help="the run that asks")
    p.add_argument("approval_id", metavar="APPROVAL_ID", nargs="?",
                   help="the approval to answer (see --list)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--allow", action="store_true", help="let the tool call run")
    g.add_argument("--deny", action="store_true", help="refuse the tool call")
    g.add_argument("--list", action="store_true", help="list pending approvals of the run")
    p.add_argument("--reason", help="a note passed to the agent with a denial")
    p.add_argument("--json", action="store_true",
                   help="with --list: one JSON object a line, with the HTTP API's fields "
                   "(approval_id, run_id, tool, args, created_at, expires_at)")
    add_store_option(p)
    p.set_defaults(func=Handler("corral.cli._approve:approve"))


def threads_arguments(p: argparse.ArgumentParser) -> None:
    """``corral threads``' parser and its subcommands'."""
    cmds = p.add_subparsers(dest="threads_command", metavar="ACTION", required=True)
    ls = cmds.add_parser("ls", help="threads, newest activity first")
    add_store_option(ls)
    ls.add_argument("--limit", type=int, default=50, metavar="N",
                    help="show at most N threads (default 50)")
    ls.add_argument("--json", action="store_true", help="one JSON array of objects")
    ls.set_defaults(func=Handler("corral.cli._threads:run_ls"))
    show = cmds.add_parser("show", help="a thread's runs, checkpoints and saved sessions")
    add_store_option(show)
    show.add_argument("thread", metavar="THREAD", help="the thread id")
    show.add_argument("--json", action="store_true", help="one JSON object")
    show.set_defaults(func=Handler("corral.cli._threads:run_show"))
    undo = cmds.add_parser("undo", help="put the workspace and conversation back as they "
                           "were before the thread's last turn (kept in the history, "
                           "marked undone)")
    add_store_option(undo)
    undo.add_argument("thread", metavar="THREAD", help="the thread id")
    undo.add_argument("--json", action="store_true", help="the thread as one JSON object")
    undo.set_defaults(func=Handler("corral.cli._threads:run_undo"))
    fork = cmds.add_parser("fork", help="start a new thread from this one's state after a "
                           "run (default: its current state), in a sandbox of its own")
    add_store_option(fork)
    fork.add_argument("thread", metavar="THREAD", help="the thread id")
    fork.add_argument("--as", dest="new", required=True, metavar="NEW",
                      help="the new thread's id")
    fork.add_argument("--at", metavar="RUN_ID",
                      help="fork from the state after this run of the thread")
    fork.add_argument("--json", action="store_true", help="the new thread as one JSON object")
    fork.set_defaults(func=Handler("corral.cli._threads:run_fork"))
    rm = cmds.add_parser("rm", help="remove a thread's saved sessions, checkpoints and "
                         "sandboxes (its run logs are kept unless --runs)")
    add_store_option(rm)
    rm.add_argument("thread", metavar="THREAD", help="the thread id")
    rm.add_argument("--runs", action="store_true",
                    help="also remove its runs: their records, event logs and approvals")
    rm.add_argument("--json", action="store_true", help="what was removed, one JSON object")
    rm.set_defaults(func=Handler("corral.cli._threads:run_rm"))


# ---------------------------------------------------------------------------- sandboxes


def exec_arguments(p: argparse.ArgumentParser) -> None:
    """``corral exec``'s parser."""
    from corral.sandbox._contracts import DEFAULT_PROVIDER

    p.description = (
        "Run COMMAND in a fresh sandbox (destroyed afterwards unless --keep) or in an "
        "existing one (--sandbox ID). Output streams live; the exit status is the "
        "command's (128+N when it died of signal N)."
    )
    p.add_argument("--provider", metavar="NAME", default=None,
                   help=f"sandbox provider (default: {DEFAULT_PROVIDER}; $CORRAL_PROVIDER)")
    p.add_argument("--sandbox", metavar="ID", help="run in this existing sandbox")
    p.add_argument("--keep", action="store_true", help="keep a fresh sandbox; print its id on stderr")
    p.add_argument("--name", metavar="ID", help="id for the fresh sandbox")
    p.add_argument("--cwd", metavar="DIR", help="working directory in the sandbox (default /workspace)")
    p.add_argument("--env", metavar="NAME=VALUE", action="append", default=[],
                   help="set an environment variable (repeatable)")
    p.add_argument("--timeout", type=duration_arg("--timeout"), metavar="DURATION",
                   help="kill the command after this long, e.g. 30s, 10m")
    p.add_argument("--network", action="store_true", help="give a fresh sandbox network access")
    p.add_argument("--json", action="store_true",
                   help='the output as JSON lines {"stream": "stdout"|"stderr", "data": TEXT}, '
                        'then {"exit_code", "signal", "timed_out"}')
    p.add_argument("--disk", metavar="SIZE",
                   help="disk limit of a fresh sandbox, e.g. 64M or 10G (an error where it "
                        "cannot be enforced)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND...",
                   help="the program and its arguments, after --")
    p.set_defaults(func=Handler("corral.cli._exec:run"))


def sandboxes_arguments(p: argparse.ArgumentParser) -> None:
    """``corral sandboxes``' parser and its subcommands'."""
    cmds = p.add_subparsers(dest="sandboxes_command", metavar="ACTION", required=True)
    ls = cmds.add_parser("ls", help="list this store's sandboxes, with their store and run")
    add_store_option(ls)
    ls.add_argument("--provider", metavar="NAME", help="only this provider")
    ls.add_argument("--all-stores", action="store_true",
                    help="every store's sandboxes (a Docker daemon is shared by every store "
                         "on the machine)")
    ls.add_argument("--json", action="store_true", help="one JSON array of objects")
    ls.set_defaults(func=Handler("corral.cli._sandboxes:run_ls"))
    rm = cmds.add_parser("rm", help="destroy sandboxes (kills their processes, deletes their "
                         "files); refuses a running run's or another store's without --force")
    add_store_option(rm)
    rm.add_argument("ids", nargs="+", metavar="ID", help="sandbox ids (see corral sandboxes ls)")
    rm.add_argument("--provider", metavar="NAME", help="only look in this provider")
    rm.add_argument("--force", action="store_true",
                    help="remove it even if its run is running or it belongs to another store")
    rm.set_defaults(func=Handler("corral.cli._sandboxes:run_rm"))
    prune = cmds.add_parser(
        "prune", help="destroy bubblewrap sandboxes whose $CORRAL_HOME state was deleted"
    )
    prune.set_defaults(func=Handler("corral.cli._sandboxes:run_prune"))


def gc_arguments(p: argparse.ArgumentParser) -> None:
    """``corral gc``'s parser."""
    add_store_option(p)
    p.add_argument("--dry-run", action="store_true", help="list what would be destroyed")
    p.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    p.add_argument("--json", action="store_true", help="print one JSON document: {dry_run, entries, counts, chunks}")
    p.add_argument("--orphan-grace", type=float, default=600.0, metavar="SECONDS",
                   help="leave unrecorded sandboxes younger than this (default 600: one may "
                        "be being made)")
    p.set_defaults(func=Handler("corral.cli._sandboxes:run_gc"))


def reap_arguments(p: argparse.ArgumentParser) -> None:
    """``corral reap``'s parser."""
    from corral.runs._reap_limits import DEFAULT_BUDGET, DEFAULT_MAX_RUNS

    p.description = (
        "One reaper sweep: runs whose viewer left and whose agent has exited are "
        "finalized; runs detached for at least --ttl are cancelled and ended; their "
        "sandboxes are destroyed. Runs still producing are not touched. Run it from cron."
    )
    p.add_argument("--ttl", default=DEFAULT_TTL, metavar="DURATION",
                   help=f"expire runs detached for at least this long (default {DEFAULT_TTL})")
    p.add_argument("--max-runs", type=_max_runs, default=DEFAULT_MAX_RUNS, metavar="N",
                   help=f"runs one sweep takes on (default {DEFAULT_MAX_RUNS})")
    p.add_argument("--budget", default=f"{DEFAULT_BUDGET:g}s", metavar="DURATION",
                   help=f"time one run's drive may take (default {DEFAULT_BUDGET:g}s)")
    add_store_option(p)
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=Handler("corral.cli._reap:reap"))


def _max_runs(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 10_000:
        raise argparse.ArgumentTypeError(f"must be a whole number from 0 to 10000, got {text!r}")
    return value


# ---------------------------------------------------------------------------- service


def acp_arguments(p: argparse.ArgumentParser) -> None:
    """``corral acp``'s parser."""
    from corral.sandbox._contracts import DEFAULT_PROVIDER

    p.description = (
        "The editor starts this command and speaks the Agent Client Protocol on its "
        "stdin/stdout. Each editor session is a corral thread; each prompt a durable run of "
        "the chosen harness in a sandbox holding a copy of the session's directory (kept for "
        "the thread's next prompts). Tool calls, file changes and permission requests "
        "(corral's ask rules) reach the editor. Closing the editor detaches running runs; "
        "reopening the session (session/load) replays it and follows a run still going.")
    p.add_argument("--harness", help="harness of the runs (default: [agent] harness of "
                   "--config, else claude-code; command runs each prompt with sh -c)")
    p.add_argument("--provider", help=f"sandbox provider: {DEFAULT_PROVIDER} (default), "
                   "docker or local")
    p.add_argument("--model", metavar="M", help="model for agent harnesses")
    p.add_argument("--agent", metavar="NAME",
                   help="--harness acp: the ACP agent (gemini, opencode, claude)")
    p.add_argument("--config", metavar="PATH",
                   help="sandbox definition file (default: corral.toml in the session's "
                   "directory or its parents, read as the repository's request)")
    p.add_argument("--no-file-events", action="store_true",
                   help="do not show the files a run changes")
    add_store_option(p)
    p.set_defaults(func=Handler("corral.cli._acp:acp"))


def mcp_arguments(p: argparse.ArgumentParser) -> None:
    """``corral mcp``'s parser."""
    p.description = (
        "An MCP client (a chat app, an agent) starts this command and gets tools to start a "
        "run or a thread turn in a sandbox, read its events page by page, answer its "
        "approvals, cancel it, and list runs and threads. Runs it starts are driven by this "
        "process; when the client goes they detach and go on (``corral attach`` follows one "
        "again). ``corral serve`` offers the same tools over HTTP at ``/mcp``.")
    add_store_option(p)
    p.add_argument("--config", metavar="FILE",
                   help="TOML file naming sandboxes and what runs may use (the format of "
                   "corral serve --config)")
    p.add_argument("--workspace-root", action="append", metavar="DIR",
                   help="a run's workspace must lie under DIR (repeatable; default: the "
                   "file's workspace_roots, else the current directory)")
    p.set_defaults(func=Handler("corral.cli._mcp:mcp"))


# ---------------------------------------------------------------------------- set-up


def doctor_arguments(p: argparse.ArgumentParser) -> None:
    """``corral doctor``'s parser."""
    add_store_option(p)
    p.add_argument("--json", action="store_true",
                   help="print one JSON document: {checks, not_in_this_version, ready}")
    p.set_defaults(func=Handler("corral.cli._doctor:run"))


def agents_arguments(p: argparse.ArgumentParser) -> None:
    """``corral agents``' parser and its subcommands'."""
    from corral.harness._packages import KNOWN_AGENTS

    sub = p.add_subparsers(dest="agents_command", metavar="SUBCOMMAND")
    p.set_defaults(func=lambda args: _usage(p))

    inst = sub.add_parser("install", help="install an agent CLI from npm at a pinned version")
    inst.add_argument("name", choices=sorted(KNOWN_AGENTS), metavar="NAME",
                      help="one of: " + ", ".join(sorted(KNOWN_AGENTS)))
    inst.add_argument("--version", dest="agent_version", default=None,
                      help="exact npm version (default: the tested, pinned version)")
    inst.add_argument("--force", action="store_true", help="reinstall even if present")
    inst.add_argument("--json", action="store_true",
                      help="print one JSON document: {name, version, package, path, bin}")
    inst.set_defaults(func=Handler("corral.cli._agents:install"))

    listing = sub.add_parser("ls", help="list installed agent CLIs")
    listing.add_argument("--json", action="store_true",
                         help="print one JSON array of the installs")
    listing.set_defaults(func=Handler("corral.cli._agents:ls"))

    pruning = sub.add_parser(
        "prune", help="remove shared agent installs no home uses (root: /var/lib/corral)",
        description="Remove the agent installs under $CORRAL_SHARED_DIR/agents/installs that "
                    "no agents directory links to any more (a deleted $CORRAL_HOME stops "
                    "counting) and no running process uses.")
    pruning.add_argument("--dry-run", action="store_true",
                         help="say what would be removed, remove nothing")
    pruning.add_argument("--json", action="store_true",
                         help="print one JSON document: {dry_run, removed, kept, note}")
    pruning.set_defaults(func=Handler("corral.cli._agents:prune"))


def _usage(p: argparse.ArgumentParser) -> int:
    """``corral agents`` without a subcommand: its help on stderr, a usage error."""
    p.print_help(sys.stderr)
    return 2


def images_arguments(p: argparse.ArgumentParser) -> None:
    """``corral images``' parser and its subcommands'."""
    cmds = p.add_subparsers(dest="images_command", metavar="ACTION", required=True)
    build = cmds.add_parser(
        "build", help="make corral's base image from Debian packages (mmdebstrap; no registry)")
    build.add_argument("--tag", metavar="TAG", help="image tag (default corral-base:<version>)")
    build.add_argument("--suite", default="bookworm", metavar="SUITE",
                       help="Debian suite (default bookworm)")
    build.add_argument("--docker-host", metavar="URL", help="the daemon (default $DOCKER_HOST)")
    build.add_argument("--force", action="store_true", help="rebuild when the tag exists")
    build.add_argument("--json", action="store_true",
                       help="print one JSON document: {tag, built}")
    build.set_defaults(func=Handler("corral.cli._images:run_build"))


def completion_arguments(p: argparse.ArgumentParser) -> None:
    """``corral completion``'s parser."""
    p.description = (
        "Print a completion script for SHELL. bash: add "
        "'eval \"$(corral completion bash)\"' to ~/.bashrc; zsh: the same with zsh in "
        "~/.zshrc; fish: corral completion fish > ~/.config/fish/completions/corral.fish")
    p.add_argument("shell", choices=SHELLS, metavar="SHELL", help="bash, zsh or fish")
    p.set_defaults(func=Handler("corral.cli._completion:completion"))
