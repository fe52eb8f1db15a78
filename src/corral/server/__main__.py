"""``python -m corral.server``: the same as ``corral serve``."""

from __future__ import annotations

from corral.server._serve_cli import main

if __name__ == "__main__":
    raise SystemExit(main())
