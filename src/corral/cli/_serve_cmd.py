"""``corral serve``: the HTTP API, the event streams and the web page.

The server drives every run it starts in the background (a viewer leaving never stops a
run), takes over runs whose driver died when someone watches them, and sweeps abandoned
runs on an interval under a store-wide lock. Several ``corral serve`` processes on one
machine can share one SQLite store; any of them serves any run.
"""

from __future__ import annotations

import argparse

from corral.server._command import add_serve_options, config_from_args, serve_main

__all__ = ["add_serve_options", "config_from_args", "register", "run"]

run = serve_main


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve",
        help="serve the HTTP API and the web page",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    add_serve_options(p)
    p.set_defaults(func=run)
