"""``corral agents install|ls|prune``: the parsers; :mod:`corral.cli._agents_impl` runs them."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from corral.cli._parser import arguments

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the ``agents`` command group."""
    p = subparsers.add_parser(
        "agents", help="install and list agent CLIs (claude-code, codex, gemini-cli, opencode)")
    sub = p.add_subparsers(dest="agents_command", metavar="SUBCOMMAND")
    p.set_defaults(func=lambda args: (p.print_help(sys.stderr), 2)[1])

    inst = sub.add_parser("install", help="install an agent CLI from npm at a pinned version")
    arguments(inst, _install_arguments)
    inst.set_defaults(func=_install)

    ls = sub.add_parser("ls", help="list installed agent CLIs")
    ls.add_argument("--json", action="store_true", help="print one JSON array of the installs")
    ls.set_defaults(func=_ls)

    prune = sub.add_parser(
        "prune", help="remove shared agent installs no home uses (root: /var/lib/corral)",
        description="Remove the agent installs under $CORRAL_SHARED_DIR/agents/installs that "
                    "no agents directory links to any more (a deleted $CORRAL_HOME stops "
                    "counting) and no running process uses.")
    prune.add_argument("--dry-run", action="store_true",
                       help="say what would be removed, remove nothing")
    prune.add_argument("--json", action="store_true",
                       help="print one JSON document: {dry_run, removed, kept, note}")
    prune.set_defaults(func=_prune)


# Lazy imports below: the agent installs load when a `corral agents` command is used, not for
# every command's parser.
def _install_arguments(inst: argparse.ArgumentParser) -> None:
    from corral.agents._installs import KNOWN_AGENTS

    inst.add_argument("name", choices=sorted(KNOWN_AGENTS), metavar="NAME",
                      help="one of: " + ", ".join(sorted(KNOWN_AGENTS)))
    inst.add_argument("--version", dest="agent_version", default=None,
                      help="exact npm version (default: the tested, pinned version)")
    inst.add_argument("--force", action="store_true", help="reinstall even if present")
    inst.add_argument("--json", action="store_true",
                      help="print one JSON document: {name, version, package, path, bin}")


def _install(args: argparse.Namespace) -> int:
    from corral.cli._agents_impl import install

    return install(args)


def _ls(args: argparse.Namespace) -> int:
    from corral.cli._agents_impl import ls

    return ls(args)


def _prune(args: argparse.Namespace) -> int:
    from corral.cli._agents_impl import prune

    return prune(args)
