"""``corral agents install|ls|prune``: the agent CLIs corral runs, installed from npm at
pinned versions, listed, and pruned from the machine's shared installs."""

from __future__ import annotations

import argparse
import json
import sys

from corral.agents._installs import (
    agents_report,
    agents_root,
    check_version,
    install_agent,
    list_installed,
    missing_companions,
    package_for,
)
from corral.agents._shared import prune_installs
from corral.cli._progress import Stages

__all__ = ["install", "ls", "prune"]


def install(args: argparse.Namespace) -> int:
    pkg = package_for(args.name)
    version = check_version(args.agent_version or pkg.version)
    with Stages(f"installing {args.name} {version}", sys.stderr) as stages:
        agent = install_agent(args.name, args.agent_version, force=args.force,
                              progress=stages.stage)
    if getattr(args, "json", False):
        print(json.dumps({"name": agent.name, "version": agent.version,
                          "package": agent.package, "path": str(agent.path),
                          "bin": str(agent.bin_path)}))
    else:
        print(f"{agent.name} {agent.version} installed at {agent.path}")
    return 0


def ls(args: argparse.Namespace) -> int:
    root = agents_root()
    installed = list_installed(root)
    if args.json:  # one answer: one document (an array, as `corral ls --json`)
        print(json.dumps([{"name": a.name, "version": a.version, "package": a.package,
                           "path": str(a.path), "bin": str(a.bin_path),
                           "companions": [{"package": c.package, "version": c.version,
                                           "bin": str(a.path / c.rel_bin)}
                                          for c in a.companions]} for a in installed]))
        return 0
    if not installed:
        print(f"no agent CLIs installed under {root}; try `corral agents install claude-code`")
    for a in installed:
        print(f"{a.name:<12} {a.version:<10} {a.path}")
        for c in a.companions:
            print(f"{'':<12} {'':<10} + {c.package} {c.version} ({c.rel_bin})")
        for c in missing_companions(a):
            print(f"{'':<12} {'':<10} - {c.package} {c.version} missing: run "
                  f"`corral agents install {a.name}`")
    for status in agents_report(root):
        if not status.installed and status.supported:
            print(f"{status.name:<12} {'-':<10} {status.message}")
    return 0


def _mb(n: int) -> str:
    return f"{n / 1e6:.0f} MB"


def prune(args: argparse.Namespace) -> int:
    report = prune_installs(dry_run=args.dry_run)
    if args.json:
        print(json.dumps(report.as_json()))
        return 0
    if report.note:
        print(f"corral: {report.note}", file=sys.stderr)
    verb = "would remove" if args.dry_run else "removed"
    for p in report.removed:
        print(f"{verb} {p.name} {p.version} ({_mb(p.bytes)}) {p.path}")
    for p in report.kept:
        print(f"kept {p.name} {p.version} ({_mb(p.bytes)}): {p.reason}")
    freed = sum(p.bytes for p in report.removed)
    print(f"corral: {verb} {len(report.removed)} install(s) ({_mb(freed)}), kept "
          f"{len(report.kept)}", file=sys.stderr)
    return 0
