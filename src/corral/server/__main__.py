"""``python -m corral.server``: the same as ``corral serve``."""

from __future__ import annotations

import argparse
import sys

from corral.cli.serve_cmd import add_arguments, run
from corral.errors import CorralError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="corral serve",
                                     description="Serve the corral HTTP API and web page.")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except CorralError as exc:
        print(f"corral: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
