"""``corral images build``: make the docker provider's base image (Debian packages through
mmdebstrap; no registry)."""

from __future__ import annotations

import argparse
import json
import sys

from corral.cli._progress import Stages
from corral.providers._docker_client import BASE_IMAGE
from corral.providers._docker_image import build_base_image, image_exists

__all__ = ["run_build"]


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
