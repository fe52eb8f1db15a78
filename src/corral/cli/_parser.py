"""Command parsers whose arguments are declared when the command is used.

``corral`` builds one parser with every command on every start, and ``corral --version``
should not pay for what ``corral serve`` needs. A command module therefore imports only
``argparse`` at module level: its parser's name and help are declared at once (they make up
``corral --help``), its arguments can be declared later, by a function that imports what they
need (the run statuses, the serve options, the known agent CLIs) the first time that parser
parses or prints help — i.e. only for the command actually run.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["CommandParser", "Handler", "arguments"]

# Takes the parsed namespace and returns the process exit code.
Handler = Callable[[argparse.Namespace], int]
AddArguments = Callable[[argparse.ArgumentParser], None]


class CommandParser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` that adds deferred arguments (see :func:`arguments`)
    before it parses or formats anything, so what it parses and prints is exactly what an
    eagerly built parser would."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pending: list[AddArguments] = []

    def add_arguments_later(self, add: AddArguments) -> None:
        self._pending.append(add)

    def _complete(self) -> None:
        while self._pending:
            self._pending.pop(0)(self)

    # argparse hands a chosen subcommand's arguments to its parser's parse_known_args
    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._complete()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        self._complete()
        return super().format_usage()

    def format_help(self) -> str:
        self._complete()
        return super().format_help()


def arguments(parser: argparse.ArgumentParser, add: AddArguments) -> None:
    """Declare ``parser``'s arguments with ``add(parser)`` when the parser is first used; at
    once when it is a plain :class:`argparse.ArgumentParser` (a caller that builds one
    command's parser by hand gets it complete)."""
    if isinstance(parser, CommandParser):
        parser.add_arguments_later(add)
    else:
        add(parser)
