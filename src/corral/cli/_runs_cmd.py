"""``corral run``, ``attach``, ``cancel``, ``ls`` and ``show``: the parsers.

Their handlers import what each needs when it runs: ``ls`` reads a SQLite store directly
(:mod:`corral.cli._ls_impl`), ``show`` and ``attach`` open the store layer
(:mod:`corral.cli._runs_view`; ``attach`` loads the runner while it already prints the
logged events), ``run`` and ``cancel`` the runner (:mod:`corral.cli._runs_control`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from corral.cli._parser import arguments
from corral.server._cmdline import add_store_option, duration_arg

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser(
        "run",
        help="start a durable run and stream its events",
        description=(
            "Start a run in a fresh sandbox and stream its events until it ends. "
            "Ctrl-C detaches (the run goes on; `corral attach RUN_ID` to watch again); "
            "a second Ctrl-C within 2 s cancels it."
        ),
    )
    run.add_argument("--provider", help="sandbox provider: bubblewrap (default), docker or local")
    run.add_argument("--workspace", metavar="DIR",
                     help="directory copied into /workspace (without what its .gitignore "
                          "and .corralignore files exclude, and .git)")
    run.add_argument("--no-ignore", action="store_true",
                     help="copy the whole --workspace, ignored files and .git included")
    run.add_argument("--max-copy-size", metavar="SIZE",
                     help="most file contents to copy into /workspace, e.g. 4GiB (default: "
                          "[workspace] max_copy_size, $CORRAL_MAX_COPY_SIZE or 1GiB)")
    run.add_argument("--config", metavar="PATH",
                     help="sandbox definition file (default: corral.toml in the workspace "
                          "or the current directory, or their parents)")
    run.add_argument("--thread", metavar="T", help="thread id (default: the run id)")
    run.add_argument("--run-id", metavar="R", help="run id (default: generated)")
    run.add_argument("--harness", help="harness (default: [agent] harness in corral.toml, "
                                       "else command)")
    run.add_argument("--model", metavar="M", help="model for agent harnesses")
    run.add_argument("--agent", metavar="NAME",
                     help="--harness acp: the ACP agent (gemini, opencode, claude)")
    run.add_argument("--agent-command", metavar="CMD",
                     help="--harness acp: start this ACP agent instead (no sandbox policy)")
    run.add_argument("--timeout", type=duration_arg("--timeout"), metavar="DURATION",
                     help="stop the agent after this long, e.g. 90s, 10m, 1h30m (the run "
                          "fails, exit code 124)")
    run.add_argument("--file-events", nargs="?", const="on", choices=["on", "diff"],
                     help="log the agent's workspace changes as sandbox.file events "
                          "(--file-events diff: with patches)")
    run.add_argument("--max-output", metavar="SIZE",
                     help="stop the agent once its output passes this size (default 1GiB; "
                          "the journal lives on the host, outside the sandbox's disk quota)")
    run.add_argument("--token-budget", type=_positive(int), metavar="N",
                     help="agent harnesses: model tokens the run may use; model calls past "
                          "it are refused")
    run.add_argument("--output-schema", metavar="FILE",
                     help="agent harnesses: a JSON Schema file; the run's result is a JSON "
                          "object matching it (corral show --json, CUSTOM corral.output), "
                          "or the run fails")
    _common(run)
    run.add_argument("--detach", action="store_true", help="start, print the run id, return")
    run.add_argument("argv", nargs="*", metavar="COMMAND",
                     help="the command (after --), or the prompt for agent harnesses")
    run.set_defaults(func=_run)

    attach = sub.add_parser("attach", help="watch a run again (takes it over when needed)")
    attach.add_argument("run_id", metavar="RUN_ID", help="the run to follow")
    attach.add_argument("--after", type=int, default=0, metavar="N",
                        help="print only events after log offset N")
    _common(attach)
    attach.set_defaults(func=_attach)

    cancel = sub.add_parser("cancel", help="cancel a run from any process")
    cancel.add_argument("run_id", metavar="RUN_ID", help="the run to cancel")
    add_store_option(cancel)
    cancel.add_argument("--json", action="store_true",
                        help="print the run's record as one JSON document")
    cancel.set_defaults(func=_cancel)

    ls = sub.add_parser("ls", help="list runs")
    arguments(ls, _ls_arguments)
    ls.set_defaults(func=_ls)

    show = sub.add_parser("show", help="show one run's record")
    show.add_argument("run_id", metavar="RUN_ID", help="the run to show")
    _common(show)
    show.set_defaults(func=_show)


def _ls_arguments(ls: argparse.ArgumentParser) -> None:
    # Lazy: the run statuses (the store's records) load when `corral ls` is used.
    from corral.stores._records import RunStatus

    ls.add_argument("--thread", metavar="T", help="only this thread's runs")
    ls.add_argument("--status", choices=[s.value for s in RunStatus],
                    help="only runs in this status")
    ls.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    _common(ls)


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


def _common(p: argparse.ArgumentParser) -> None:
    add_store_option(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")


# Lazy imports below: each command imports its implementation when it runs, so that no
# command (and no parser) pays for another's modules.
def _run(args: argparse.Namespace) -> int:
    from corral.cli._runs_control import run

    return run(args)


def _cancel(args: argparse.Namespace) -> int:
    from corral.cli._runs_control import cancel

    return cancel(args)


def _attach(args: argparse.Namespace) -> int:
    from corral.cli._runs_view import attach

    return attach(args)


def _ls(args: argparse.Namespace) -> int:
    from corral.cli._ls_impl import ls

    return ls(args)


def _show(args: argparse.Namespace) -> int:
    from corral.cli._runs_view import show

    return show(args)
