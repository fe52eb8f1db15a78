"""Entry point: builds the parser from the command modules and maps errors to one line."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from corral.errors import CorralError

# Each module defines ``register(subparsers)`` and sets ``func`` on its parsers; ``func``
# takes the parsed namespace and returns the process exit code.
COMMAND_MODULES: tuple[str, ...] = (
    "corral.cli.exec_cmd",  # corral exec
    "corral.cli.sandboxes_cmd",  # corral sandboxes ls|rm
    "corral.cli.doctor_cmd",  # corral doctor
    "corral.cli.runs_cmd",  # corral run|attach|cancel|ls|show
    "corral.cli.reap_cmd",  # corral reap
    "corral.cli.gc_cmd",  # corral gc
    "corral.cli.serve_cmd",  # corral serve
    "corral.cli.agents_cmd",  # corral agents install|ls
    "corral.cli.approve_cmd",  # corral approve
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
    from corral import __version__

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
    except CorralError as exc:
        print(f"corral: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
