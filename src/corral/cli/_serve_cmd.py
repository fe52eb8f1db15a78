"""``corral serve``: the HTTP API, the event streams and the web page.

The server drives every run it starts in the background (a viewer leaving never stops a
run), takes over runs whose driver died when someone watches them, and sweeps abandoned
runs on an interval under a store-wide lock. Several ``corral serve`` processes on one
machine can share one SQLite store; any of them serves any run.
"""

from __future__ import annotations

import argparse

from corral.cli._parser import arguments

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve",
        help="serve the HTTP API and the web page",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    arguments(p, _arguments)
    p.set_defaults(func=run)


# Lazy imports below: the serve options and the server (the app, uvicorn, the runner) are
# shared with `python -m corral.server` and load when `corral serve` is used, not for every
# command's parser.
def _arguments(p: argparse.ArgumentParser) -> None:
    from corral.server._command import add_serve_options

    add_serve_options(p)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM (:func:`corral.server._command.serve_main`)."""
    from corral.server._command import serve_main

    return serve_main(args)
