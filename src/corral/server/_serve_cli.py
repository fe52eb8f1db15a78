"""The server's command line, shared by ``corral serve`` and ``python -m corral.server``: the
serve options, the :class:`~corral.server._config.ServerConfig` they describe and running it.
``corral serve``'s entry in the CLI's command table is :func:`serve_arguments`; what every
command line shares (the one-line error report, ``--store``, durations) is
:mod:`corral._cmdline`."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from corral._cmdline import add_store_option, run_reporting_errors
from corral._durations import parse_duration
from corral._errors import ConfigError
from corral.server._config import (
    DEFAULT_HEARTBEAT,
    ServerConfig,
    load_config_file,
    token_from_env,
)

__all__ = ["SERVE_DESCRIPTION", "add_serve_options", "config_from_args", "main",
           "serve_arguments", "serve_main"]

SERVE_DESCRIPTION = (
    "The server drives every run it starts in the background (a viewer leaving never stops "
    "a run), takes over runs whose driver died when someone watches them, and sweeps "
    "abandoned runs on an interval under a store-wide lock. Several ``corral serve`` "
    "processes on one machine can share one SQLite store; any of them serves any run.")
"""``corral serve --help``'s description."""


def serve_arguments(p: argparse.ArgumentParser) -> None:
    """``corral serve``'s parser (the CLI's command table names it): the serve options,
    run by :func:`serve_main`."""
    p.description = SERVE_DESCRIPTION
    add_serve_options(p)
    p.set_defaults(func=serve_main)


def add_serve_options(p: argparse.ArgumentParser) -> None:
    """The options of ``corral serve`` and ``python -m corral.server``."""
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; anything but loopback "
                   "needs CORRAL_API_TOKEN)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 = any free)")
    add_store_option(p)
    p.add_argument("--config", metavar="FILE",
                   help="TOML file naming sandboxes and what inline sandboxes may use")
    p.add_argument("--reap-interval", default="60s", metavar="DURATION",
                   help="how often the built-in reaper sweeps (default 60s)")
    p.add_argument("--reap-ttl", default="1h", metavar="DURATION",
                   help="a run nobody watched for this long is cancelled (default 1h)")
    p.add_argument("--no-reaper", action="store_true", help="do not run the built-in reaper")
    p.add_argument("--heartbeat", type=float, default=DEFAULT_HEARTBEAT, metavar="SECONDS",
                   help=f"SSE keep-alive interval (default {DEFAULT_HEARTBEAT:g})")
    p.add_argument("--max-active-runs", type=int, default=None, metavar="N",
                   help="runs this process drives at most (default 200)")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error"], help="log level")


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The :class:`~corral.server.ServerConfig` the serve options describe (validated)."""
    extra: dict[str, Any] = load_config_file(args.config) if args.config else {}
    if args.max_active_runs is not None:
        if args.max_active_runs < 1:
            raise ConfigError("--max-active-runs must be at least 1")
        extra["max_active_runs"] = args.max_active_runs
    config = ServerConfig(
        host=args.host,
        port=args.port,
        store_url=args.store,
        token=token_from_env(),
        reaper=not args.no_reaper,
        reap_interval=parse_duration(args.reap_interval, what="--reap-interval"),
        reap_ttl=parse_duration(args.reap_ttl, what="--reap-ttl"),
        heartbeat=args.heartbeat,
        **extra,
    )
    config.validate()
    return config


def serve_main(args: argparse.Namespace) -> int:
    """Serve what the parsed serve options describe until SIGINT/SIGTERM; the exit code."""
    config = config_from_args(args)
    # here, not at the top, and after a refused configuration: `corral serve --help` and
    # `corral completion` declare the serve options, and the server (the app, uvicorn, the
    # run service) would be most of their start-up
    import anyio

    from corral.server._serve import serve_async

    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        # one format for corral's lines, uvicorn's and the access log (serve_async adds no
        # handler of its own)
        format="%(asctime)s corral serve: %(levelname)s %(name)s: %(message)s",
        datefmt="%Y-%m-%dT%H:%M:%S%z",
        stream=sys.stderr,
    )

    def ready(url: str) -> None:
        auth = "bearer token required" if config.token else "no token: loopback only"
        print(f"corral: serving on {url} ({auth})", file=sys.stderr, flush=True)

    anyio.run(lambda: serve_async(config, ready=ready, log_level=args.log_level))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m corral.server``: the same as ``corral serve``."""
    parser = argparse.ArgumentParser(
        prog="corral serve", description="Serve the HTTP API and the web page."
    )
    add_serve_options(parser)
    return run_reporting_errors(serve_main, parser.parse_args(argv))
