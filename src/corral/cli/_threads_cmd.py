"""``corral threads ls|show|undo|fork|rm``: the parsers; :mod:`corral.cli._threads_impl`
runs them."""

from __future__ import annotations

import argparse

from corral.server._cmdline import add_store_option


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("threads", help="list threads; undo, fork or remove one")
    cmds = p.add_subparsers(dest="threads_command", metavar="ACTION", required=True)
    ls = cmds.add_parser("ls", help="threads, newest activity first")
    add_store_option(ls)
    ls.add_argument("--limit", type=int, default=50, metavar="N",
                    help="show at most N threads (default 50)")
    ls.add_argument("--json", action="store_true", help="one JSON array of objects")
    ls.set_defaults(func=_run_ls)
    show = cmds.add_parser("show", help="a thread's runs, checkpoints and saved sessions")
    add_store_option(show)
    show.add_argument("thread", metavar="THREAD", help="the thread id")
    show.add_argument("--json", action="store_true", help="one JSON object")
    show.set_defaults(func=_run_show)
    undo = cmds.add_parser("undo", help="put the workspace and conversation back as they "
                           "were before the thread's last turn (kept in the history, "
                           "marked undone)")
    add_store_option(undo)
    undo.add_argument("thread", metavar="THREAD", help="the thread id")
    undo.add_argument("--json", action="store_true", help="the thread as one JSON object")
    undo.set_defaults(func=_run_undo)
    fork = cmds.add_parser("fork", help="start a new thread from this one's state after a "
                           "run (default: its current state), in a sandbox of its own")
    add_store_option(fork)
    fork.add_argument("thread", metavar="THREAD", help="the thread id")
    fork.add_argument("--as", dest="new", required=True, metavar="NEW",
                      help="the new thread's id")
    fork.add_argument("--at", metavar="RUN_ID",
                      help="fork from the state after this run of the thread")
    fork.add_argument("--json", action="store_true", help="the new thread as one JSON object")
    fork.set_defaults(func=_run_fork)
    rm = cmds.add_parser("rm", help="remove a thread's saved sessions, checkpoints and "
                         "sandboxes (its run logs are kept unless --runs)")
    add_store_option(rm)
    rm.add_argument("thread", metavar="THREAD", help="the thread id")
    rm.add_argument("--runs", action="store_true",
                    help="also remove its runs: their records, event logs and approvals")
    rm.add_argument("--json", action="store_true", help="what was removed, one JSON object")
    rm.set_defaults(func=_run_rm)


# Lazy imports below: the runner loads when a `corral threads` command runs.
def _run_ls(args: argparse.Namespace) -> int:
    from corral.cli._threads_impl import run_ls

    return run_ls(args)


def _run_show(args: argparse.Namespace) -> int:
    from corral.cli._threads_impl import run_show

    return run_show(args)


def _run_undo(args: argparse.Namespace) -> int:
    from corral.cli._threads_impl import run_undo

    return run_undo(args)


def _run_fork(args: argparse.Namespace) -> int:
    from corral.cli._threads_impl import run_fork

    return run_fork(args)


def _run_rm(args: argparse.Namespace) -> int:
    from corral.cli._threads_impl import run_rm

    return run_rm(args)
