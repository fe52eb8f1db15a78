"""``corral agents install NAME [--version V]`` and ``corral agents ls``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from corral.agents._installs import (
    KNOWN_AGENTS,
    agents_report,
    agents_root,
    check_version,
    find_installed,
    install_agent,
    list_installed,
    package_for,
)

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the ``agents`` command group."""
    p = subparsers.add_parser("agents", help="install and list agent CLIs (claude-code, codex)")
    sub = p.add_subparsers(dest="agents_command", metavar="SUBCOMMAND")
    p.set_defaults(func=lambda args: (p.print_help(sys.stderr), 2)[1])

    inst = sub.add_parser("install", help="install an agent CLI from npm at a pinned version")
    inst.add_argument("name", choices=sorted(KNOWN_AGENTS), metavar="NAME",
                      help="one of: " + ", ".join(sorted(KNOWN_AGENTS)))
    inst.add_argument("--version", dest="agent_version", default=None,
                      help="exact npm version (default: the tested, pinned version)")
    inst.add_argument("--force", action="store_true", help="reinstall even if present")
    inst.set_defaults(func=_install)

    ls = sub.add_parser("ls", help="list installed agent CLIs")
    ls.add_argument("--json", action="store_true", help="print one JSON object per install")
    ls.set_defaults(func=_ls)


def _install(args: argparse.Namespace) -> int:
    pkg = package_for(args.name)
    version = check_version(args.agent_version or pkg.version)
    if args.force or find_installed(args.name, version) is None:
        print(f"installing {pkg.package}@{version} ...", file=sys.stderr)
    agent = install_agent(args.name, args.agent_version, force=args.force)
    print(f"{agent.name} {agent.version} installed at {agent.path}")
    return 0


def _ls(args: argparse.Namespace) -> int:
    root = agents_root()
    installed = list_installed(root)
    if args.json:
        for a in installed:
            print(json.dumps({"name": a.name, "version": a.version, "package": a.package,
                              "path": str(a.path), "bin": str(a.bin_path)}))
        return 0
    if not installed:
        print(f"no agent CLIs installed under {root}; try `corral agents install claude-code`")
    for a in installed:
        print(f"{a.name:<12} {a.version:<10} {a.path}")
    for status in agents_report(root):
        if not status.installed and status.supported:
            print(f"{status.name:<12} {'-':<10} {status.message}")
    return 0
