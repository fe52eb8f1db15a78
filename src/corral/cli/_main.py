"""Entry point: builds the parser from the command modules and maps errors to one line."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from corral._errors import CorralError
from corral._paths import describe_os_error

# Each module defines ``register(subparsers)`` and sets ``func`` on its parsers; ``func``
# takes the parsed namespace and returns the process exit code.
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
)

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="corral",
        description="Run coding-agent CLIs in isolated sandboxes with durable runs.",
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # command not built yet in this checkout
                continue
            raise
        module.register(sub)
    return parser


def _version() -> str:
    from corral._version import __version__

    return f"corral {__version__}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Handler | None = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return func(args)
    except (CorralError, OSError, KeyboardInterrupt, BaseExceptionGroup) as exc:
        code = _one_line(exc)
        if code is None:
            raise
        return code


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def _one_line(exc: BaseException) -> int | None:
    """Print the one error line for ``exc`` and return the exit code; ``None`` for an error
    that is a bug (its traceback is shown). A task group's ``ExceptionGroup`` counts as its
    first user-facing error (the others are usually its consequences)."""
    leaves = _leaves(exc)
    if any(isinstance(e, KeyboardInterrupt) for e in leaves):
        return 130
    for leaf in leaves:
        if isinstance(leaf, CorralError):
            print(f"corral: error: {leaf}", file=sys.stderr)
            return 2
    for leaf in leaves:
        # the host's file system failed corral (read-only, full, permissions): the path
        # and the fix, not a traceback
        if isinstance(leaf, OSError) and not isinstance(leaf, ConnectionError):
            print(f"corral: error: {describe_os_error(leaf)}", file=sys.stderr)
            return 1
    return None


if __name__ == "__main__":
    raise SystemExit(main())
