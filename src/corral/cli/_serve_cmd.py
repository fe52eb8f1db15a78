"""``corral serve``: the HTTP API, the event streams and the web page.

The server drives every run it starts in the background (a viewer leaving never stops a
run), takes over runs whose driver died when someone watches them, and sweeps abandoned
runs on an interval under a store-wide lock. Several ``corral serve`` processes on one
machine can share one SQLite store; any of them serves any run.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

import anyio

from corral._errors import ConfigError
from corral.server._config import (
    DEFAULT_HEARTBEAT,
    ServerConfig,
    load_config_file,
    token_from_env,
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve",
        help="serve the HTTP API and the web page",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    add_arguments(p)
    p.set_defaults(func=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``corral serve`` (shared with ``python -m corral.server``)."""
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; anything but loopback "
                   "needs CORRAL_API_TOKEN)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 = any free)")
    p.add_argument("--store", metavar="URL", help="store URL (default $CORRAL_STORE or SQLite)")
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
    """The :class:`ServerConfig` the options describe (validated)."""
    from corral.cli._reap_cmd import parse_duration

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


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="corral serve: %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from corral.server._serve import serve_async

    def ready(url: str) -> None:
        auth = "bearer token required" if config.token else "no token: loopback only"
        print(f"corral: serving on {url} ({auth})", file=sys.stderr, flush=True)

    anyio.run(lambda: serve_async(config, ready=ready, log_level=args.log_level))
    return 0
