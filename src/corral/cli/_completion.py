"""``corral completion bash|zsh|fish``: shell completion scripts made from the parser itself,
so they never fall behind it: the command paths (``sandboxes ls``), each path's options,
which options take a value and the choices of those that have them. Declaring every command
imports :mod:`corral.cli._arguments` alone, no command's work: a shell that evaluates the
script at start-up pays for the parser only."""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass, field

from corral.cli._main import CommandParser, build_parser

__all__ = ["completion", "script"]


def completion(args: argparse.Namespace) -> int:
    """Print the script for ``args.shell`` (every command declared: its options too)."""
    print(script(build_parser(), args.shell), end="")
    return 0


@dataclass
class _Node:
    """One command path: ``corral``, ``corral sandboxes``, ``corral sandboxes ls`` (never
    empty: bash refuses an empty key)."""

    subs: dict[str, str] = field(default_factory=dict)  # name -> help
    options: dict[str, str] = field(default_factory=dict)  # --opt -> help
    valued: set[str] = field(default_factory=set)  # options that take a value
    choices: dict[str, list[str]] = field(default_factory=dict)  # --opt -> choices
    positional_choices: list[str] = field(default_factory=list)


def _walk(parser: argparse.ArgumentParser, path: str, out: dict[str, _Node]) -> None:
    if isinstance(parser, CommandParser):
        parser.declare()  # a command's arguments, from its module (corral.cli._main)
    node = out.setdefault(path, _Node())
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                node.subs[name] = helps.get(name, "")
                _walk(sub, f"{path} {name}", out)
            continue
        for opt in action.option_strings:
            node.options[opt] = action.help if isinstance(action.help, str) else ""
            if action.nargs != 0:
                node.valued.add(opt)
                if action.choices:
                    node.choices[opt] = [str(c) for c in action.choices]
        if not action.option_strings and action.choices:
            node.positional_choices = [str(c) for c in action.choices]


def _tree(parser: argparse.ArgumentParser) -> dict[str, _Node]:
    out: dict[str, _Node] = {}
    _walk(parser, "corral", out)
    return out


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script for ``shell`` (``bash``, ``zsh`` or ``fish``)."""
    tree = _tree(parser)
    if shell == "fish":
        return _fish(tree)
    body = _bash(tree)
    if shell == "zsh":  # zsh runs bash's completion function through bashcompinit
        return ("# corral completion for zsh: eval \"$(corral completion zsh)\" in ~/.zshrc\n"
                "autoload -U +X compinit && compinit\n"
                "autoload -U +X bashcompinit && bashcompinit\n" + body)
    return "# corral completion for bash: eval \"$(corral completion bash)\" in ~/.bashrc\n" + body


def _q(words: list[str] | set[str]) -> str:
    return shlex.quote(" ".join(sorted(words)))


def _bash(tree: dict[str, _Node]) -> str:
    lines = ["declare -gA _corral_subs _corral_opts _corral_valued _corral_choices"]
    for path, node in tree.items():
        key = shlex.quote(path)
        lines.append(f"_corral_subs[{key}]={_q(list(node.subs))}")
        lines.append(f"_corral_opts[{key}]={_q(list(node.options))}")
        lines.append(f"_corral_valued[{key}]={_q(node.valued)}")
        for opt, choices in node.choices.items():
            lines.append(f"_corral_choices[{shlex.quote(path + ' ' + opt)}]={_q(choices)}")
        if node.positional_choices:
            lines.append(f"_corral_choices[{shlex.quote(path + ' ')}]={_q(node.positional_choices)}")
    lines.append(_BASH_FUNCTION)
    return "\n".join(lines) + "\n"


_BASH_FUNCTION = r"""_corral() {
    local cur prev path=corral i w skip=0
    cur="${COMP_WORDS[COMP_CWORD]}"
    prev="${COMP_WORDS[COMP_CWORD-1]}"
    for ((i=1; i<COMP_CWORD; i++)); do
        w="${COMP_WORDS[i]}"
        if ((skip)); then skip=0; continue; fi
        if [[ "$w" == "--" ]]; then COMPREPLY=(); return 0; fi  # the sandboxed command's words
        if [[ "$w" == -* ]]; then
            [[ "$w" != *=* && " ${_corral_valued[$path]} " == *" $w "* ]] && skip=1
            continue
        fi
        if [[ " ${_corral_subs[$path]} " == *" $w "* ]]; then
            path="$path $w"
        fi
    done
    if ((skip)); then
        if [[ -n "${_corral_choices[$path $prev]+x}" ]]; then
            COMPREPLY=($(compgen -W "${_corral_choices[$path $prev]}" -- "$cur"))
        else
            COMPREPLY=($(compgen -f -- "$cur"))
        fi
        return 0
    fi
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "${_corral_opts[$path]}" -- "$cur"))
    elif [[ -n "${_corral_subs[$path]}" ]]; then
        COMPREPLY=($(compgen -W "${_corral_subs[$path]}" -- "$cur"))
    elif [[ -n "${_corral_choices[$path ]+x}" ]]; then
        COMPREPLY=($(compgen -W "${_corral_choices[$path ]}" -- "$cur"))
    else
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
}
complete -F _corral corral"""


def _fish(tree: dict[str, _Node]) -> str:
    out = ["# corral completion for fish: corral completion fish > "
           "~/.config/fish/completions/corral.fish",
           "function __corral_subs",
           "    switch \"$argv[1]\""]
    for path, node in tree.items():
        if node.subs:
            out.append(f"        case {shlex.quote(path)}")
            out.append(f"            printf '%s\\n' {' '.join(sorted(node.subs))}")
    out += ["    end", "end",
            "function __corral_valued",
            "    switch \"$argv[1]\""]
    for path, node in tree.items():
        if node.valued:
            out.append(f"        case {shlex.quote(path)}")
            out.append(f"            printf '%s\\n' {' '.join(sorted(node.valued))}")
    out += ["    end", "end", _FISH_PATH]
    for path, node in tree.items():
        at = shlex.quote(f"__corral_at {shlex.quote(path)}")
        for name, help_ in node.subs.items():
            out.append(f"complete -c corral -f -n {at} -a {name} -d {shlex.quote(help_)}")
        for opt, help_ in node.options.items():
            flag = f"-l {opt[2:]}" if opt.startswith("--") else f"-s {opt[1:]}"
            value = ""
            if opt in node.choices:
                value = f" -x -a {shlex.quote(' '.join(node.choices[opt]))}"
            elif opt in node.valued:
                value = " -r"
            out.append(f"complete -c corral -n {at} {flag}{value} -d {shlex.quote(help_)}")
        if node.positional_choices:
            out.append(f"complete -c corral -f -n {at} -a "
                       f"{shlex.quote(' '.join(node.positional_choices))}")
    return "\n".join(out) + "\n"


_FISH_PATH = r"""function __corral_path
    set -l words (commandline -opc)
    set -l path corral
    set -l skip 0
    for w in $words[2..-1]
        if test $skip = 1
            set skip 0
            continue
        end
        if test "$w" = "--"
            echo "--"
            return
        end
        if string match -q -- '-*' $w
            if not string match -q -- '*=*' $w; and contains -- $w (__corral_valued "$path")
                set skip 1
            end
            continue
        end
        if contains -- $w (__corral_subs "$path")
            set path "$path $w"
        end
    end
    echo $path
end
function __corral_at
    test (__corral_path) = "$argv[1]"
end"""
