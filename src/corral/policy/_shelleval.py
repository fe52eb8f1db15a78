"""Code bash evaluates inside what looks like data, and the names whose values it reads.

bash evaluates arithmetic (where single quotes are plain characters) and array subscripts,
expanding ``$(…)`` inside them, also in a variable's *value* (``x='a[$(id)]'; echo
$((x))``). Every such context must hold only numbers, plain names, ``$name`` and operators
(:func:`check_evaluated`), and a name whose value bash evaluates may not be one the string
sets to anything else (:class:`Names`).
"""

from __future__ import annotations

import re

from corral.policy._shelltree import ShellParseError, Word

__all__ = ["Names", "check_evaluated"]

# One token of text bash evaluates as arithmetic (or as a name with a subscript): numbers,
# names, `$name`/`${name}`, parameters that are always numbers, operators. Anything else
# (quotes, `$(…)`, backticks, `${x:-…}`, `$1`, backslashes) is refused: bash expands it,
# and in arithmetic even single quotes are plain characters, not quotes.
_EVAL_TOKEN_RE = re.compile(
    r"""(?P<ws>[ \t\n]+|")"""
    r"""|(?P<num>0[xX][0-9A-Fa-f]+|[0-9]+\#[0-9A-Za-z@_]+|[0-9]+)"""
    r"""|(?P<count>\$[#?$!]|\$\{\#[A-Za-z_][A-Za-z0-9_]*(?:\[[@*]\])?\}|\$\{[#?$!]\})"""
    r"""|(?P<param>\$[A-Za-z_][A-Za-z0-9_]*|\$\{[A-Za-z_][A-Za-z0-9_]*\})"""
    r"""|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"""
    r"""|(?P<assign>(?:\*\*|<<|>>|[-+*/%&^|])?=(?!=)|\+\+|--)"""
    r"""|(?P<op>\*\*|<<|>>|&&|\|\||[<>=!]=|[-+*/%<>!~&^|?:,;()])"""
    r"""|(?P<open>\[)|(?P<close>\])"""
)
_NUMBER_RE = re.compile(r"[-+]?(?:0[xX][0-9A-Fa-f]+|[0-9]+)?\Z")
_NUM_RANGE_RE = re.compile(r"\{-?[0-9]+\.\.-?[0-9]+(?:\.\.-?[0-9]+)?\}\Z")
_EVAL_ON_ASSIGN = frozenset({"RANDOM", "SRANDOM", "OPTIND", "HISTCMD"})
"""Variables whose assigned value bash evaluates as arithmetic."""
_SHELL_SET = {
    "_": "bash (the previous command's last argument)",
    "BASH_COMMAND": "bash (the command's own text)",
    "BASH_EXECUTION_STRING": "bash (the `-c` string)",
    "BASH_REMATCH": "`[[ … =~ … ]]`", "REPLY": "`read`/`select`", "OPTARG": "`getopts`",
    "MAPFILE": "`mapfile`", "BASH_ARGV": "bash (the arguments)", "BASH_SOURCE": "bash",
    "FUNCNAME": "bash", "PWD": "`cd`", "OLDPWD": "`cd`", "DIRSTACK": "`pushd`",
    "BASH_ARGV0": "bash", "COMP_WORDS": "bash", "COMP_LINE": "bash", "READLINE_LINE": "bash",
}  # fmt: skip
"""Variables bash itself sets from the string or its data: never plain numbers."""


class Names:
    """Which names bash may evaluate the *value* of, and which ones the string sets.

    bash evaluates a name's value as code where it reads arithmetic (``x='a[$(id)]';
    echo $((x))`` runs ``id``), in ``${!x}`` and in a ``[[ -v $x ]]`` operand. Such a
    reference is safe only if nothing in the string gives the name a value that is not a
    plain number: :meth:`check` refuses the string otherwise, once every part (nested
    shells included) has been read, since a loop or a function may run a reference after
    an assignment written later. Values from the environment the string starts with are
    not the string's doing and are not judged.
    """

    __slots__ = ("refs", "unsafe")

    def __init__(self) -> None:
        self.unsafe: dict[str, str] = dict(_SHELL_SET)
        self.refs: dict[str, str] = {}

    def assigned(self, name: str, value: Word | None, how: str) -> None:
        """``name`` gets ``value`` (None: a value known only at run time) by ``how``."""
        if value is not None and not value.dynamic and _NUMBER_RE.match(value.text):
            return
        if value is not None and not value.glob and _NUM_RANGE_RE.match(value.text):
            return  # {1..5}: numbers only
        if name in _EVAL_ON_ASSIGN:
            raise ShellParseError(
                f"bash evaluates a value assigned to {name} as arithmetic, and {how} "
                f"assigns it something other than a plain number"
            )
        self.unsafe.setdefault(name, how)

    def referenced(self, name: str, context: str) -> None:
        """bash evaluates the value of ``name`` as code in ``context``."""
        self.refs.setdefault(name, context)

    def check(self) -> None:
        """Raise :class:`ShellParseError` if an evaluated name is one the string sets."""
        for name, context in self.refs.items():
            how = self.unsafe.get(name)
            if how is not None:
                raise ShellParseError(
                    f"bash evaluates the value of `{name}` as arithmetic or a name "
                    f"({context}), and {how} gives it a value that is not a plain number"
                )


def check_evaluated(text: str, context: str, names: Names) -> frozenset[str]:
    """Refuse ``text`` that bash evaluates (as arithmetic or a subscripted name) unless
    it holds only numbers, names, ``$name``, count parameters and operators.

    Names whose value the text evaluates are recorded in ``names``; the return value is
    the set of names it assigns (``i++``, ``x = 1``, ``a[i] += 2``).
    """
    pos = 0
    assigned: set[str] = set()
    last_name: str | None = None  # the name a following `=`/`++`/`[` belongs to
    brackets: list[str | None] = []
    closed: str | None = None  # the array a just-closed subscript belongs to
    pending_prefix = False  # a `++`/`--` before a name
    end = len(text)
    while pos < end:
        m = _EVAL_TOKEN_RE.match(text, pos)
        if m is None:
            raise ShellParseError(
                f"bash evaluates {text.strip()!r} as arithmetic ({context}) and it holds "
                f"{text[pos:pos + 12]!r}: only numbers, plain names, $name and operators "
                "can be judged there"
            )
        kind = m.lastgroup
        tok = m.group(0)
        pos = m.end()
        if kind == "ws":
            continue
        target, last_name, closed = (last_name or closed), None, None
        if kind == "name" or kind == "param":
            name = tok.lstrip("${").rstrip("}")
            names.referenced(name, context)
            last_name = name
            if pending_prefix:
                assigned.add(name)
                pending_prefix = False
        elif kind == "assign":
            if target is not None:
                assigned.add(target)
            elif tok in ("++", "--"):
                pending_prefix = True
        elif kind == "open":
            brackets.append(target)
        elif kind == "close":
            if not brackets:
                raise ShellParseError(f"unbalanced `]` in {text.strip()!r} ({context})")
            closed = brackets.pop()
        else:
            pending_prefix = False
    if brackets:
        raise ShellParseError(f"unclosed `[` in {text.strip()!r} ({context})")
    return frozenset(assigned)

