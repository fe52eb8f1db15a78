"""``corral images build``: make the docker provider's base image."""

from __future__ import annotations

import argparse
import sys

from corral.providers._docker_client import BASE_IMAGE
from corral.providers._docker_image import build_base_image, image_exists

__all__ = ["run_build"]


def run_build(args: argparse.Namespace) -> int:
    tag = args.tag or BASE_IMAGE
    if not args.force and image_exists(tag, docker_host=args.docker_host):
        print(f"corral: {tag} exists (--force rebuilds it)", file=sys.stderr)
        print(tag)
        return 0

    def progress(line: str) -> None:
        print(f"corral: {line}", file=sys.stderr, flush=True)

    build_base_image(tag, docker_host=args.docker_host, suite=args.suite, progress=progress)
    print(tag)
    return 0
