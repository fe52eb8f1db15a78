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
    "corral.cli._threads_cmd",  # corral threads ls|show|undo|fork|rm
    "corral.cli._reap_cmd",  # corral reap
    "corral.cli._gc_cmd",  # corral gc
    "corral.cli._serve_cmd",  # corral serve
    "corral.cli._acp_cmd",  # corral acp
    "corral.cli._mcp_cmd",  # corral mcp
    "corral.cli._agents_cmd",  # corral agents install|ls
    "corral.cli._approve_cmd",  # corral approve
    "corral.cli._images_cmd",  # corral images build
    "corral.cli._completion_cmd",  # corral completion bash|zsh|fish
)

# `corral --help` lists the commands by task, as `docker --help` and `gh --help` do. Every
# command is in exactly one group (tests/test_cli_conventions.py checks it).
COMMAND_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Runs", ("run", "attach", "cancel", "ls", "show", "approve", "threads")),
    ("Sandboxes", ("exec", "sandboxes", "gc", "reap")),
    ("Service", ("serve", "acp", "mcp")),
    ("Set-up", ("doctor", "agents", "images", "completion")),
)

LOG_LEVELS: tuple[str, ...] = ("debug", "info", "warning", "error")


class TopParser(argparse.ArgumentParser):
    """``corral``'s own parser: its help lists the commands in :data:`COMMAND_GROUPS`."""

    def format_help(self) -> str:
        text = super().format_help()
        sub = next(a for a in self._actions if isinstance(a, argparse._SubParsersAction))
        helps = {a.dest: a.help or "" for a in sub._choices_actions}
        width = max(len(name) for name in helps) + 2
        listing = []
        for title, names in COMMAND_GROUPS:
            listing.append(f"{title}:")
            listing += [f"  {name:<{width}}{helps[name]}" for name in names if name in helps]
            listing.append("")
        # argparse's own listing of the COMMAND positional is replaced by the groups
        head, _, rest = text.partition("positional arguments:\n")
        _, _, options = rest.partition("\noptions:\n")
        return (f"{head}" + "\n".join(listing) + "\noptions:\n" + options
                + "\nRun 'corral COMMAND --help' for a command's options.\n")


def build_parser(modules: Sequence[str] = COMMAND_MODULES) -> argparse.ArgumentParser:
    """The ``corral`` parser with every command of ``modules`` (an import error propagates)."""
    parser = TopParser(
        prog="corral",
        description="Run coding-agent CLIs in isolated sandboxes with durable runs.",
    )
    add_global_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)
    for name in modules:
        importlib.import_module(name).register(sub)
    return parser


def add_global_options(parser: argparse.ArgumentParser) -> None:
    """``--version``, ``-v`` and ``--log-level``: the options before the command."""
    parser.add_argument("--version", action="version", version=f"corral {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, dest="verbose",
                        help="log more: -v for info, -vv for debug (on stderr)")
    parser.add_argument("--log-level", choices=LOG_LEVELS, default=None, dest="cli_log_level",
                        help="log level on stderr (default warning)")


def log_level(args: argparse.Namespace) -> str | None:
    """The level the global ``-v``/``--log-level`` ask for, ``None`` when neither is given."""
    if args.cli_log_level:
        return str(args.cli_log_level)
    verbose = int(getattr(args, "verbose", 0) or 0)
    return {0: None, 1: "info"}.get(verbose, "debug")


def _configure_logging(args: argparse.Namespace) -> None:
    """corral's log records on stderr, one line each. ``corral serve`` configures its own
    (its format, its ``--log-level``, which a global one overrides)."""
    level = log_level(args)
    if getattr(args, "command", None) == "serve":
        if level is not None:
            args.log_level = level
        return
    import logging  # here, not at the top: `corral --version` never needs it

    logging.basicConfig(level=(level or "warning").upper(), stream=sys.stderr,
                        format="corral: %(levelname)s %(name)s: %(message)s")


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
    _configure_logging(args)
    return run_reporting_errors(func, args)


if __name__ == "__main__":
    raise SystemExit(main())
