"""Entry point: the command table, the ``corral`` parser, and errors as one line.

As pip does, one table (:data:`COMMANDS`) names every command, the function that declares
its arguments and the summary ``corral --help`` lists. Every start builds the top parser
from the table alone, with one empty parser per command; a command's arguments are declared
only when that command's parser parses or prints help (:class:`CommandParser`), by
:mod:`corral.cli._arguments`, which imports no command's work. A command's handler is named
``"module:function"`` (:class:`Handler`): its module, which imports what the command needs
at module level (being imported means being run), is imported only when the command runs.
So ``corral --version`` imports no command module, ``corral ls`` only ``ls``'s, and
``corral run --help``, a usage error and ``corral completion`` (every command declared)
none (``tests/test_cli_imports.py`` checks which modules they load).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from corral._cmdline import VIEWER_LEFT, flush_stdout, run_reporting_errors
from corral._version import __version__

__all__ = ["COMMANDS", "COMMAND_GROUPS", "Command", "CommandParser", "Handler", "build_parser",
           "main"]


class Command(NamedTuple):
    """A row of the command table."""

    arguments: str
    """``"module:function"``: ``function(parser)`` declares the command's arguments and sets
    its handler (``func``: the parsed namespace in, the exit code out; a :class:`Handler`,
    so that declaring imports none of the command's work)."""
    summary: str
    """The command's line in ``corral --help``."""


# In this order in argparse's "invalid choice" message. Every declaration is in
# corral.cli._arguments but serve's, the server's own (shared with python -m corral.server).
COMMANDS: Mapping[str, Command] = {
    "exec": Command("corral.cli._arguments:exec_arguments", "run a command in a sandbox"),
    "sandboxes": Command("corral.cli._arguments:sandboxes_arguments",
                         "list or remove sandboxes"),
    "doctor": Command("corral.cli._arguments:doctor_arguments",
                      "check prerequisites and print fixes"),
    "run": Command("corral.cli._arguments:run_arguments",
                   "start a durable run and stream its events"),
    "attach": Command("corral.cli._arguments:attach_arguments",
                      "watch a run again (takes it over when needed)"),
    "cancel": Command("corral.cli._arguments:cancel_arguments", "cancel a run from any process"),
    "ls": Command("corral.cli._arguments:ls_arguments", "list runs"),
    "show": Command("corral.cli._arguments:show_arguments", "show one run's record"),
    "threads": Command("corral.cli._arguments:threads_arguments",
                       "list threads; undo, fork or remove one"),
    "reap": Command("corral.cli._arguments:reap_arguments",
                    "finalize or expire detached runs once and reclaim their sandboxes"),
    "gc": Command("corral.cli._arguments:gc_arguments",
                  "destroy sandboxes idle past their keep_alive, and orphans (labelled "
                  "sandboxes no instance record points to)"),
    "serve": Command("corral.server._serve_cli:serve_arguments",
                     "serve the HTTP API and the web page"),
    "acp": Command("corral.cli._arguments:acp_arguments", "be an ACP agent on stdio (for editors)"),
    "mcp": Command("corral.cli._arguments:mcp_arguments",
                   "serve corral's run tools to an MCP client on stdio"),
    "agents": Command("corral.cli._arguments:agents_arguments",
                      "install and list agent CLIs (claude-code, codex, gemini-cli, opencode)"),
    "approve": Command("corral.cli._arguments:approve_arguments",
                       "answer a pending host-tool approval of a run"),
    "images": Command("corral.cli._arguments:images_arguments", "the docker provider's images"),
    "completion": Command("corral.cli._arguments:completion_arguments",
                          "print a shell completion script (bash, zsh, fish)"),
}

# `corral --help` lists the commands by task, as `docker --help` and `gh --help` do. Every
# command is in exactly one group (tests/test_cli_conventions.py checks it).
COMMAND_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Runs", ("run", "attach", "cancel", "ls", "show", "approve", "threads")),
    ("Sandboxes", ("exec", "sandboxes", "gc", "reap")),
    ("Service", ("serve", "acp", "mcp")),
    ("Set-up", ("doctor", "agents", "images", "completion")),
)

LOG_LEVELS: tuple[str, ...] = ("debug", "info", "warning", "error")

class Handler:
    """A command's handler named ``"module:function"`` (the parsed namespace in, the exit
    code out), what a declaration sets as ``func``: the module is imported when the command
    runs, not when its arguments are declared. An import error propagates."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def resolve(self) -> Callable[[argparse.Namespace], int]:
        """The function itself (its module imported)."""
        module, _, function = self.name.partition(":")
        found: Callable[[argparse.Namespace], int] = getattr(
            importlib.import_module(module), function)
        return found

    def __call__(self, args: argparse.Namespace) -> int:
        return self.resolve()(args)

    def __repr__(self) -> str:
        return f"Handler({self.name!r})"


def declare(parser: argparse.ArgumentParser, arguments: str) -> None:
    """Import ``arguments`` (a table row's ``"module:function"``) and declare ``parser``
    with it; an import error propagates (a broken install, never a command quietly
    missing)."""
    module, _, function = arguments.partition(":")
    getattr(importlib.import_module(module), function)(parser)


class CommandParser(argparse.ArgumentParser):
    """A command's parser, declared by its table row (``arguments=``) the first time it
    parses or formats anything, so what it parses and prints is exactly what a parser
    declared at once would. The command's own subcommand parsers are plain ones
    (``arguments`` is ``None``)."""

    def __init__(self, *args: Any, arguments: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._arguments = arguments

    def declare(self) -> None:
        """Declare the command now (idempotent): what ``corral completion`` walks."""
        if self._arguments is not None:
            arguments, self._arguments = self._arguments, None
            declare(self, arguments)

    # argparse hands a chosen command's arguments to its parser's parse_known_args
    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self.declare()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        self.declare()
        return super().format_usage()

    def format_help(self) -> str:
        self.declare()
        return super().format_help()


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


def build_parser(commands: Mapping[str, Command] = COMMANDS, *, eager: bool = False
                 ) -> argparse.ArgumentParser:
    """The ``corral`` parser with ``commands``, each declared when used (``eager``: at
    once, with plain parsers, as tests compare)."""
    parser = TopParser(
        prog="corral",
        description="Run coding-agent CLIs in isolated sandboxes with durable runs.",
    )
    add_global_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND",
                                parser_class=argparse.ArgumentParser if eager else CommandParser)
    for name, command in commands.items():
        if eager:
            declare(sub.add_parser(name, help=command.summary), command.arguments)
        else:
            sub.add_parser(name, help=command.summary, arguments=command.arguments)
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
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    _configure_logging(args)
    return run_reporting_errors(func, args)


if __name__ == "__main__":
    raise SystemExit(main())
