"""``corral exec``: the parser; :mod:`corral.cli._exec_impl` runs it."""

from __future__ import annotations

import argparse

from corral.server._cmdline import duration_arg

DEFAULT_PROVIDER = "bubblewrap"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "exec",
        help="run a command in a sandbox",
        description=(
            "Run COMMAND in a fresh sandbox (destroyed afterwards unless --keep) or in an "
            "existing one (--sandbox ID). Output streams live; the exit status is the "
            "command's (128+N when it died of signal N)."
        ),
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
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    # Lazy: the providers load when `corral exec` runs, not for every command's parser.
    from corral.cli._exec_impl import run

    return run(args)
