"""``corral completion bash|zsh|fish``: the parser; :mod:`corral.cli._completion` writes
the script."""

from __future__ import annotations

import argparse

SHELLS = ("bash", "zsh", "fish")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "completion", help="print a shell completion script (bash, zsh, fish)",
        description="Print a completion script for SHELL. bash: add "
        "'eval \"$(corral completion bash)\"' to ~/.bashrc; zsh: the same with zsh in "
        "~/.zshrc; fish: corral completion fish > ~/.config/fish/completions/corral.fish")
    p.add_argument("shell", choices=SHELLS, metavar="SHELL", help="bash, zsh or fish")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from corral.cli._completion import script
    from corral.cli._main import build_parser

    print(script(build_parser(), args.shell), end="")
    return 0
