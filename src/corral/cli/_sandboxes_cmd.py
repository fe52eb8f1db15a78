"""``corral sandboxes ls|rm|prune``: the parsers; :mod:`corral.cli._sandboxes_impl` runs
them."""

from __future__ import annotations

import argparse

from corral.server._cmdline import add_store_option


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("sandboxes", help="list or remove sandboxes")
    cmds = p.add_subparsers(dest="sandboxes_command", metavar="ACTION", required=True)
    ls = cmds.add_parser("ls", help="list this store's sandboxes, with their store and run")
    add_store_option(ls)
    ls.add_argument("--provider", metavar="NAME", help="only this provider")
    ls.add_argument("--all-stores", action="store_true",
                    help="every store's sandboxes (a Docker daemon is shared by every store "
                         "on the machine)")
    ls.add_argument("--json", action="store_true", help="one JSON array of objects")
    ls.set_defaults(func=_run_ls)
    rm = cmds.add_parser("rm", help="destroy sandboxes (kills their processes, deletes their "
                         "files); refuses a running run's or another store's without --force")
    add_store_option(rm)
    rm.add_argument("ids", nargs="+", metavar="ID", help="sandbox ids (see corral sandboxes ls)")
    rm.add_argument("--provider", metavar="NAME", help="only look in this provider")
    rm.add_argument("--force", action="store_true",
                    help="remove it even if its run is running or it belongs to another store")
    rm.set_defaults(func=_run_rm)
    prune = cmds.add_parser(
        "prune", help="destroy bubblewrap sandboxes whose $CORRAL_HOME state was deleted"
    )
    prune.set_defaults(func=_run_prune)


# Lazy imports below: the providers load when a `corral sandboxes` command runs, not for
# every command's parser.
def _run_ls(args: argparse.Namespace) -> int:
    from corral.cli._sandboxes_impl import run_ls

    return run_ls(args)


def _run_rm(args: argparse.Namespace) -> int:
    from corral.cli._sandboxes_impl import run_rm

    return run_rm(args)


def _run_prune(args: argparse.Namespace) -> int:
    from corral.cli._sandboxes_impl import run_prune

    return run_prune(args)
