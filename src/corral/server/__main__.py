"""``python -m corral.server``: the same as ``corral serve``."""

from __future__ import annotations

import sys

from corral.cli._main import main as cli_main


def main(argv: list[str] | None = None) -> int:
    return cli_main(["serve", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
