"""What every corral command line shares: the one-line error report, the ``--store`` option,
duration options and a closed standard output.

``corral`` (:mod:`corral.cli`) and ``python -m corral.server`` both use these, so the server
never imports the CLI; this module sits below every package and imports only the standard
library and corral's bottom modules, so ``corral --version`` pays for nothing else."""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Callable
from typing import Final

from corral._durations import parse_duration
from corral._errors import ConfigError, CorralError
from corral._paths import describe_os_error

__all__ = [
    "STORE_HELP",
    "VIEWER_LEFT",
    "add_store_option",
    "duration_arg",
    "flush_stdout",
    "is_closed_pipe",
    "run_reporting_errors",
    "silence_stdout",
]

VIEWER_LEFT: Final = 128 + 13
"""The exit status of a command whose standard output was closed under it (``corral run …
| head``): 128 + SIGPIPE, what a shell reports for ``git log | head`` or ``yes | head``
under ``pipefail``. The command exits quietly; a run it drove goes on, detached."""

STORE_HELP: Final = "store URL (default $CORRAL_STORE or SQLite)"


def duration_arg(what: str) -> Callable[[str], float]:
    """An argparse ``type`` for a positive duration option named ``what`` (``--timeout``):
    :func:`~corral._durations.parse_duration` (the one duration parser), its one-line
    error as argparse's usage error."""

    def parse(text: str) -> float:
        try:
            return parse_duration(text, what=what, positive=True)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = "duration"  # argparse names it in "invalid duration value"
    return parse


def add_store_option(p: argparse.ArgumentParser) -> None:
    """``--store URL``: the one declaration every command that opens the store uses."""
    p.add_argument("--store", metavar="URL", help=STORE_HELP)


def run_reporting_errors(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """``func(args)``, with a user-facing error printed as one line and turned into the exit
    code (2 for a corral error, 1 for a host file-system failure, 130 for Ctrl-C). A bug keeps
    its traceback. A standard output closed by its reader (``| head``) is a viewer leaving,
    not an error: the command exits quietly with :data:`VIEWER_LEFT`, also when only the
    final flush finds the pipe closed."""
    try:
        code = func(args)
        return code if flush_stdout() else VIEWER_LEFT
    except (CorralError, OSError, KeyboardInterrupt, BaseExceptionGroup) as exc:
        if any(isinstance(e, OSError) and is_closed_pipe(e) for e in _leaves(exc)):
            silence_stdout()
            return VIEWER_LEFT
        reported = _one_line(exc)
        if reported is None:
            raise
        return reported


def is_closed_pipe(exc: OSError) -> bool:
    """Whether ``exc`` is a write to a pipe whose reader left (``| head``)."""
    return isinstance(exc, BrokenPipeError) or exc.errno == errno.EPIPE


def flush_stdout() -> bool:
    """Flush standard output now, not at interpreter exit (where a closed pipe is an
    ``Exception ignored … BrokenPipeError`` message and status 120); ``False`` (and
    standard output silenced) when its reader left."""
    try:
        sys.stdout.flush()
    except OSError as exc:
        if not is_closed_pipe(exc):
            raise
        silence_stdout()
        return False
    return True


def silence_stdout() -> None:
    """Point standard output at ``/dev/null``: its reader left, and what is still buffered
    (flushed at exit) must not raise ``BrokenPipeError`` again (Python's advice for EPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass  # no file descriptor behind sys.stdout (tests): nothing will flush to a pipe


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
