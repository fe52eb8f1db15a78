"""``corral images build``: the parser; :mod:`corral.cli._images_impl` runs it."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("images", help="the docker provider's images")
    cmds = p.add_subparsers(dest="images_command", metavar="ACTION", required=True)
    build = cmds.add_parser(
        "build", help="make corral's base image from Debian packages (mmdebstrap; no registry)")
    build.add_argument("--tag", metavar="TAG", help="image tag (default corral-base:<version>)")
    build.add_argument("--suite", default="bookworm", metavar="SUITE",
                       help="Debian suite (default bookworm)")
    build.add_argument("--docker-host", metavar="URL", help="the daemon (default $DOCKER_HOST)")
    build.add_argument("--force", action="store_true", help="rebuild when the tag exists")
    build.add_argument("--json", action="store_true",
                       help="print one JSON document: {tag, built}")
    build.set_defaults(func=_run_build)


def _run_build(args: argparse.Namespace) -> int:
    # Lazy: the Docker SDK loads only when the command runs.
    from corral.cli._images_impl import run_build

    return run_build(args)
