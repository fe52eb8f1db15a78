"""``corral images build``: make the docker provider's base image (Debian packages through
mmdebstrap; no registry)."""

from __future__ import annotations

import argparse
import json
import sys

from corral.cli._progress import Stages
from corral.providers._docker_client import BASE_IMAGE
from corral.providers._docker_image import build_base_image, image_exists

__all__ = ["images_arguments", "run_build"]


def images_arguments(p: argparse.ArgumentParser) -> None:
    """``corral images``' parser and its subcommands'."""
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
    build.set_defaults(func=run_build)


def run_build(args: argparse.Namespace) -> int:
    tag = args.tag or BASE_IMAGE
    if not args.force and image_exists(tag, docker_host=args.docker_host):
        print(f"corral: {tag} exists (--force rebuilds it)", file=sys.stderr)
        _answer(args, tag, built=False)
        return 0

    done: list[str] = []

    def progress(line: str) -> None:
        if line.startswith("built "):  # the last word, not a stage
            done.append(line)
        else:
            stages.stage(line)

    with Stages(f"building {tag}", sys.stderr) as stages:
        build_base_image(tag, docker_host=args.docker_host, suite=args.suite,
                         progress=progress)
    for line in done:
        print(f"corral: {line}", file=sys.stderr, flush=True)
    _answer(args, tag, built=True)
    return 0


def _answer(args: argparse.Namespace, tag: str, *, built: bool) -> None:
    if getattr(args, "json", False):
        print(json.dumps({"tag": tag, "built": built}))
    else:
        print(tag)
