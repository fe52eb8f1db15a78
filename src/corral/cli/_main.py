"""Entry point: builds the parser from the command modules and maps errors to one line.

Every start builds the whole parser, so the command modules are light: each imports only
``argparse`` and :mod:`corral.cli._parser` at module level, declares its arguments when its
parser is used and imports its implementation when its handler runs (``corral --version`` and
``corral ls`` never import the runner, the harnesses, HTTP or AG-UI;
``tests/test_cli_imports.py`` checks which modules they load)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from corral._version import __version__
from corral.cli._parser import CommandParser, Handler
from corral.server._cmdline import VIEWER_LEFT, flush_stdout, run_reporting_errors

# Each module defines ``register(subparsers)`` and sets ``func`` (a ``Handler``) on its
# parsers. Every module must import: a missing one is a broken install, never a command
# quietly left out.
COMMAND_MODULES: tuple[str, ...] = (
    "corral.cli._exec_cmd",  # corral exec
    "corral.cli._sandboxes_cmd",  # corral sandboxes ls|rm
    "corral.cli._doctor_cmd",  # corral doctor
    "corral.cli._runs_cmd",  # corral run|attach|cancel|ls|show
    "corral.cli._reap_cmd",  # corral reap
    "corral.cli._gc_cmd",  # corral gc
    "corral.cli._serve_cmd",  # corral serve
    "corral.cli._agents_cmd",  # corral agents install|ls
    "corral.cli._approve_cmd",  # corral approve
    "corral.cli._images_cmd",  # corral images build
)


def build_parser(modules: Sequence[str] = COMMAND_MODULES) -> argparse.ArgumentParser:
    """The ``corral`` parser with every command of ``modules`` (an import error propagates)."""
    parser = argparse.ArgumentParser(
        prog="corral",
        description="Run coding-agent CLIs in isolated sandboxes with durable runs.",
    )
    parser.add_argument("--version", action="version", version=f"corral {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)
    for name in modules:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit:
        # --help, --version and usage errors print, then exit: a closed pipe is quiet here too
        if not flush_stdout():
            return VIEWER_LEFT
        raise
    func: Handler | None = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    return run_reporting_errors(func, args)


if __name__ == "__main__":
    raise SystemExit(main())
