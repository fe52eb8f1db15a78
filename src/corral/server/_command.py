"""The server's command line, shared by ``corral serve`` and ``python -m corral.server``: the
serve options, the :class:`~corral.server._config.ServerConfig` they describe, running it, and
the one-line error report every corral command gives (the CLI reuses it, so the server never
imports the CLI)."""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, Final

import anyio

from corral._errors import ConfigError, CorralError
from corral._paths import describe_os_error
from corral.server._config import (
    DEFAULT_HEARTBEAT,
    ServerConfig,
    load_config_file,
    token_from_env,
)
from corral.server._serve import serve_async

STORE_HELP: Final = "store URL (default $CORRAL_STORE or SQLite)"

_UNITS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART: Final = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_PARTS: Final = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+")
_NUMBER: Final = re.compile(r"\d+(?:\.\d+)?")
_MAX_SECONDS: Final = 10 * 365 * 86400.0


def parse_duration(text: str, *, what: str = "duration") -> float:
    """Seconds in ``text``: a number with a unit (``30s``, ``5m``, ``1h``, ``2d``, ``500ms``),
    several of them (``1h30m``), or a bare number of seconds. Raises
    :class:`~corral.ConfigError` naming the bad value and the accepted forms."""
    raw = text.strip().lower()
    seconds: float | None = None
    if _NUMBER.fullmatch(raw):
        seconds = float(raw)
    elif _PARTS.fullmatch(raw):
        seconds = sum(float(n) * _UNITS[u] for n, u in _PART.findall(raw))
    if seconds is None:
        raise ConfigError(
            f"invalid {what} {text!r}: use a number with a unit, e.g. 30s, 5m, 1h, 2d or 1h30m"
        )
    if seconds > _MAX_SECONDS:
        raise ConfigError(f"invalid {what} {text!r}: longer than 10 years; use e.g. 30d")
    return seconds


def add_store_option(p: argparse.ArgumentParser) -> None:
    """``--store URL``: the one declaration every command that opens the store uses."""
    p.add_argument("--store", metavar="URL", help=STORE_HELP)


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
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="corral serve: %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )

    def ready(url: str) -> None:
        auth = "bearer token required" if config.token else "no token: loopback only"
        print(f"corral: serving on {url} ({auth})", file=sys.stderr, flush=True)

    anyio.run(lambda: serve_async(config, ready=ready, log_level=args.log_level))
    return 0


def run_reporting_errors(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """``func(args)``, with a user-facing error printed as one line and turned into the exit
    code (2 for a corral error, 1 for a host file-system failure, 130 for Ctrl-C). A bug keeps
    its traceback."""
    try:
        return func(args)
    except (CorralError, OSError, KeyboardInterrupt, BaseExceptionGroup) as exc:
        code = _one_line(exc)
        if code is None:
            raise
        return code


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m corral.server``: the same as ``corral serve``."""
    parser = argparse.ArgumentParser(
        prog="corral serve", description="Serve the HTTP API and the web page."
    )
    add_serve_options(parser)
    return run_reporting_errors(serve_main, parser.parse_args(argv))


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
