"""Split a shell command string into every simple command it would run.

This is a policy tool, not a shell: it must find *every* program a string can start, so
that ``pytest; curl x | sh`` is seen as three commands and ``$(rm -rf /)`` inside an
argument is seen at all. It understands POSIX sh plus the bash forms agents write:
quotes (``'…'``, ``"…"``, ``$'…'``), ``;`` ``&`` ``&&`` ``||`` ``|`` ``|&`` and newlines,
subshells and brace groups, ``$(…)``, backticks, ``<(…)``/``>(…)``, ``${…}`` and
``$((…))`` (scanned for substitutions), here-documents, ``if``/``while``/``until``/
``for``/``case``/functions, ``[[ … ]]`` and ``(( … ))``, env prefixes (``A=b cmd``) and
redirections. Whatever it cannot read with certainty raises :class:`ShellParseError`;
callers must then fall back to their safest answer.

bash also runs code hidden in what looks like data: it evaluates arithmetic (where single
quotes are plain characters) and array subscripts, expanding ``$(…)`` inside them, also in a
variable's *value* (``x='a[$(id)]'; echo $((x))``). Every such context must hold only
numbers, plain names, ``$name`` and operators (:func:`check_evaluated`), and a name whose
value bash evaluates may not be one the string sets to anything else (:class:`Names`).

Words keep a flag for values only known at run time (``$X``, globs, brace expansion), so
a matcher can treat them as "could be anything" when looking for a denied command.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from corral._errors import CorralError

__all__ = [
    "MAX_DEPTH",
    "Names",
    "Redirect",
    "ShellParseError",
    "SimpleCommand",
    "Word",
    "check_evaluated",
    "parse",
]

MAX_DEPTH = 16
"""Nesting limit for substitutions and re-parsed strings (``bash -c``, ``eval``)."""

_META = frozenset(" \t\n;&|()<>")
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A subscript holding `$` or a backtick is left to the word reader so that a command
# substitution inside it is seen (bash evaluates subscripts).
_ASSIGN_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\[|\+?=)")
_FD_RE = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*\}|\d*")
_BRACKET_RE = re.compile(r"\[[^\s;&|()<>]*\]")
_BRACE_RE = re.compile(r"\{[^\s{}]*(,|\.\.)[^\s{}]*\}")
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
_BRACED_HEAD_RE = re.compile(r"([#!]?)([A-Za-z_][A-Za-z0-9_]*|[0-9]+|[@*#?$!-])?")
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
_COND_ARITH_OPS = frozenset({"-eq", "-ne", "-lt", "-le", "-gt", "-ge"})
_COND_NAME_OPS = frozenset({"-v", "-R"})
_PLAIN_WORD_RE = re.compile(r"[^\s;&|()<>'\"\\`$]+")
_RESERVED_START = frozenset({"if", "then", "elif", "else", "while", "until", "do", "!", "time"})
_RESERVED_END = frozenset({"fi", "done", "esac", "}"})
_REDIR_OPS = ("<<<", "<<-", "&>>", "<<", ">>", "<&", ">&", "<>", ">|", "&>", "<", ">")


class ShellParseError(CorralError):
    """The command string cannot be read with certainty; the message says why and where."""


@dataclass(frozen=True, slots=True)
class Word:
    """One shell word after quote removal.

    ``text`` is the literal value; parts that only exist at run time keep their source
    text (``$HOME``). ``expands`` marks parameter, command or arithmetic expansion and
    brace expansion (value unknown, may split into several words); ``glob`` marks an
    unquoted ``*``, ``?`` or ``[`` (expands to file names).
    """

    text: str
    expands: bool = False
    glob: bool = False

    @property
    def dynamic(self) -> bool:
        """True when the run-time value can differ from ``text``."""
        return self.expands or self.glob


@dataclass(frozen=True, slots=True)
class Redirect:
    """A redirection: operator (``>``, ``>>``, ``<``, ``<<``, …) and its target word."""

    op: str
    target: Word

    @property
    def writes(self) -> bool:
        """True when the target is opened for writing (a file, not a descriptor)."""
        if self.op in (">&", "<&"):
            return not (self.target.text.isdigit() or self.target.text == "-")
        return self.op in (">", ">>", ">|", "&>", "&>>", "<>")


@dataclass(frozen=True, slots=True)
class SimpleCommand:
    """One program invocation (or a bare assignment / redirection) found in the string."""

    argv: tuple[Word, ...]
    assignments: tuple[tuple[str, Word], ...] = ()
    redirects: tuple[Redirect, ...] = ()
    via: tuple[str, ...] = ()
    """How it was reached from the top level, e.g. ``("$(…)",)`` or ``("bash -c",)``."""
    is_function_body: bool = False
    in_loop: bool = False
    """Inside a loop: it may run again after a part written later in the string."""

    def render(self) -> str:
        """A readable, shell-quoted rendering for explanations."""
        parts = [f"{name}={shlex.quote(w.text)}" for name, w in self.assignments]
        parts += [w.text if w.dynamic else shlex.quote(w.text) for w in self.argv]
        return " ".join(parts)


@dataclass
class _Heredoc:
    delimiter: str
    strip_tabs: bool
    expand: bool
    via: tuple[str, ...]


@dataclass
class _Out:
    commands: list[SimpleCommand] = field(default_factory=list)


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


def parse(
    source: str, *, via: tuple[str, ...] = (), depth: int = 0, names: Names | None = None
) -> list[SimpleCommand]:
    """Return every simple command in ``source``, nested substitutions included.

    Commands come roughly in execution order (a substitution before the command whose
    argument it is). Raises :class:`ShellParseError` for anything it cannot read, and for
    code bash would evaluate in arithmetic, subscripts and the ``@P`` transform. With
    ``names`` given, the caller calls :meth:`Names.check` once it has read everything;
    without, it is checked here.
    """
    if depth > MAX_DEPTH:
        raise ShellParseError(f"commands nested deeper than {MAX_DEPTH} levels")
    if "\x00" in source:
        raise ShellParseError("command contains a NUL byte")
    own = names is None
    parser = _Parser(source, via, depth, Names() if names is None else names)
    parser.parse_list(stop=())
    if parser.pos < len(source):
        raise ShellParseError(parser.where(f"unexpected {source[parser.pos]!r}"))
    if parser.pending_heredocs:
        raise ShellParseError("here-document body missing (no newline after `<<`)")
    if own:
        parser.names.check()
    return parser.out.commands


class _Parser:
    def __init__(self, src: str, via: tuple[str, ...], depth: int, names: Names) -> None:
        self.src = src
        self.pos = 0
        self.via = via
        self.depth = depth
        self.names = names
        self.out = _Out()
        self.pending_heredocs: list[_Heredoc] = []
        self.function_depth = 0
        self.loop_depth = 0

    # ------------------------------------------------------------------ helpers
    def where(self, msg: str) -> str:
        line = self.src.count("\n", 0, self.pos) + 1
        return f"{msg} at line {line}, column {self.pos - (self.src.rfind(chr(10), 0, self.pos) + 1) + 1}"

    def peek(self, n: int = 1) -> str:
        return self.src[self.pos : self.pos + n]

    def at_end(self) -> bool:
        return self.pos >= len(self.src)

    def skip_blanks(self) -> None:
        """Skip spaces, tabs, line continuations and comments (not newlines)."""
        src = self.src
        while self.pos < len(src):
            c = src[self.pos]
            if c in " \t":
                self.pos += 1
            elif src.startswith("\\\n", self.pos):
                self.pos += 2
            elif c == "#":
                end = src.find("\n", self.pos)
                self.pos = len(src) if end < 0 else end
            else:
                break

    def newline(self) -> None:
        """Consume one newline and any here-document bodies that follow it."""
        assert self.src[self.pos] == "\n"
        self.pos += 1
        if self.pending_heredocs:
            docs, self.pending_heredocs = self.pending_heredocs, []
            for doc in docs:
                self.read_heredoc(doc)

    def skip_newlines(self) -> None:
        while True:
            self.skip_blanks()
            if self.peek() == "\n":
                self.newline()
            else:
                return

    def operator(self) -> str | None:
        """The control operator at the cursor, if any (not consumed)."""
        for op in (";;&", ";;", ";&", "&&", "||", "|&", "|", "&", ";", "(", ")", "\n"):
            if self.src.startswith(op, self.pos):
                return op
        return None

    def emit(self, cmd: SimpleCommand) -> None:
        if self.loop_depth and not cmd.in_loop:
            cmd = SimpleCommand(cmd.argv, cmd.assignments, cmd.redirects, cmd.via,
                                cmd.is_function_body, in_loop=True)  # fmt: skip
        self.out.commands.append(cmd)

    def sub(self, text: str, via: str) -> None:
        """Parse a separately quoted string (backticks) as its own command list."""
        for cmd in parse(text, via=self.via + (via,), depth=self.depth + 1, names=self.names):
            self.emit(cmd)

    def child(self, via: str) -> _Parser:
        """A parser for a nested command list at the cursor (``$(…)``, ``<(…)``)."""
        inner = _Parser(self.src, self.via + (via,), self.depth + 1, self.names)
        inner.pos = self.pos
        inner.function_depth = self.function_depth
        inner.loop_depth = self.loop_depth
        return inner

    def evaluated(self, text: str, context: str) -> None:
        """``text`` is evaluated by bash as arithmetic: refuse anything but plain
        numbers and names, and show what it assigns (``(( PATH = 1 ))`` sets PATH)."""
        assigned = check_evaluated(text, context, self.names)
        if assigned:
            self.emit(SimpleCommand(
                argv=(), assignments=tuple((n, Word("…", expands=True)) for n in sorted(assigned)),
                via=self.via, is_function_body=self.function_depth > 0,
            ))  # fmt: skip

    # ------------------------------------------------------------------ grammar
    def parse_list(self, stop: tuple[str, ...]) -> None:
        """Parse ``and_or`` items separated by ``;``/``&``/newline until a stop token."""
        while True:
            self.skip_newlines()
            if self.at_end():
                return
            if self.peek() == ")" and ")" in stop:
                return
            word = self.peek_word()
            if word is not None and word in stop:
                return
            op = self.operator()
            if op in (";;", ";&", ";;&") and ";;" in stop:
                return
            if op is not None and op not in ("(",):
                raise ShellParseError(self.where(f"unexpected {op!r}"))
            self.parse_and_or(stop)
            self.skip_blanks()
            op = self.operator()
            if op in (";", "&", "\n"):
                if op == "\n":
                    self.newline()
                else:
                    self.pos += 1
                continue
            return

    def parse_and_or(self, stop: tuple[str, ...]) -> None:
        self.parse_pipeline(stop)
        while True:
            self.skip_blanks()
            op = self.operator()
            if op in ("&&", "||"):
                self.pos += 2
                self.skip_newlines()
                self.parse_pipeline(stop)
            else:
                return

    def parse_pipeline(self, stop: tuple[str, ...]) -> None:
        self.skip_blanks()
        self.parse_command(stop)
        while True:
            self.skip_blanks()
            op = self.operator()
            if op in ("|", "|&"):
                self.pos += len(op)
                self.skip_newlines()
                self.parse_command(stop)
            else:
                return

    def peek_word(self) -> str | None:
        """The next bare (unquoted, plain) word without consuming it."""
        m = _PLAIN_WORD_RE.match(self.src, self.pos)
        if not m:
            return None
        end = m.end()
        if end < len(self.src) and self.src[end] not in _META:
            return None  # the word continues with quotes or expansions
        return m.group(0)

    def expect_word(self, word: str) -> None:
        self.skip_newlines()
        if self.peek_word() != word:
            raise ShellParseError(self.where(f"expected {word!r}"))
        self.pos += len(word)

    def parse_command(self, stop: tuple[str, ...]) -> None:
        self.skip_blanks()
        if self.at_end():
            raise ShellParseError("command ends where a command was expected")
        if self.peek() == "(":
            if self.peek(2) == "((":
                self.arith_command()
            else:
                self.pos += 1
                self.parse_list(stop=(")",))
                if self.peek() != ")":
                    raise ShellParseError(self.where("unclosed `(`"))
                self.pos += 1
            self.trailing_redirects()
            return
        word = self.peek_word()
        if word == "{":
            self.pos += 1
            self.parse_list(stop=("}",))
            self.expect_word("}")
            self.trailing_redirects()
            return
        if word in ("!", "time"):
            self.pos += len(word)
            self.skip_blanks()
            if word == "time":
                while self.peek_word() in ("-p", "--"):
                    self.pos += 2
                    self.skip_blanks()
            self.parse_command(stop)
            return
        if word == "if":
            self.pos += 2
            self.parse_list(stop=("then",))
            self.expect_word("then")
            while True:
                self.parse_list(stop=("elif", "else", "fi"))
                self.skip_newlines()
                nxt = self.peek_word()
                if nxt == "elif":
                    self.pos += 4
                    self.parse_list(stop=("then",))
                    self.expect_word("then")
                elif nxt == "else":
                    self.pos += 4
                elif nxt == "fi":
                    self.pos += 2
                    break
                else:
                    raise ShellParseError(self.where("unterminated `if`"))
            self.trailing_redirects()
            return
        if word in ("while", "until"):
            self.pos += len(word)
            self.loop_depth += 1
            try:
                self.parse_list(stop=("do",))
                self.do_group()
            finally:
                self.loop_depth -= 1
            return
        if word in ("for", "select"):
            self.for_command(word)
            return
        if word == "case":
            self.case_command()
            return
        if word == "[[":
            self.cond_command()
            return
        if word == "function":
            self.pos += len(word)
            self.skip_blanks()
            name = self.peek_word()
            if name is None or not _NAME_RE.fullmatch(name.replace("-", "_").replace(".", "_")):
                raise ShellParseError(self.where("bad function name"))
            self.pos += len(name)
            self.skip_blanks()
            if self.peek(2) == "()":
                self.pos += 2
            self.function_body(stop)
            return
        if word in _RESERVED_END or word in ("then", "else", "elif", "do", "in"):
            raise ShellParseError(self.where(f"unexpected {word!r}"))
        # name() compound  — a function definition
        m = re.compile(r"([A-Za-z_][A-Za-z0-9_.:-]*)[ \t]*\([ \t]*\)").match(self.src, self.pos)
        if m:
            self.pos = m.end()
            self.function_body(stop)
            return
        self.simple_command()

    def function_body(self, stop: tuple[str, ...]) -> None:
        self.skip_newlines()
        self.function_depth += 1
        try:
            self.parse_command(stop)
        finally:
            self.function_depth -= 1

    def do_group(self) -> None:
        self.expect_word("do")
        self.parse_list(stop=("done",))
        self.expect_word("done")
        self.trailing_redirects()

    def for_command(self, kw: str) -> None:
        self.pos += len(kw)
        self.skip_blanks()
        self.loop_depth += 1
        try:
            if self.peek(2) == "((":
                self.arith_command()
            else:
                name = self.peek_word()
                if name is None or not _NAME_RE.fullmatch(name):
                    raise ShellParseError(self.where(f"bad `{kw}` variable"))
                self.pos += len(name)
                self.skip_blanks()
                how = f"`{kw} {name} in …`"
                if self.peek_word() == "in" and kw == "for":
                    self.pos += 2
                    while True:
                        self.skip_blanks()
                        if self.at_end() or self.peek() in (";", "\n"):
                            break
                        # data, but substitutions inside still run
                        self.names.assigned(name, self.read_word(), how)
                else:
                    if self.peek_word() == "in":
                        self.pos += 2
                        while True:
                            self.skip_blanks()
                            if self.at_end() or self.peek() in (";", "\n"):
                                break
                            self.read_word()
                    self.names.assigned(name, None, how)  # "$@", or what the user picks
                # the loop variable is assigned like `name=…` (`for PATH in …` counts)
                self.emit(SimpleCommand(argv=(), assignments=((name, Word("…", expands=True)),),
                                        via=self.via, is_function_body=self.function_depth > 0))
            self.skip_blanks()
            if self.peek() == ";":
                self.pos += 1
            self.do_group()
        finally:
            self.loop_depth -= 1

    def case_command(self) -> None:
        self.pos += 4
        self.skip_blanks()
        self.read_word()
        self.expect_word("in")
        while True:
            self.skip_newlines()
            if self.peek_word() == "esac":
                self.pos += 4
                break
            if self.at_end():
                raise ShellParseError("unterminated `case`")
            if self.peek() == "(":
                self.pos += 1
            while True:  # patterns: w | w | w )
                self.skip_blanks()
                self.read_word()
                self.skip_blanks()
                c = self.peek()
                if c == "|":
                    self.pos += 1
                    continue
                if c == ")":
                    self.pos += 1
                    break
                raise ShellParseError(self.where("bad `case` pattern"))
            self.parse_list(stop=("esac", ";;"))
            self.skip_newlines()
            op = self.operator()
            if op in (";;&", ";;", ";&"):
                self.pos += len(op)
            elif self.peek_word() != "esac":
                raise ShellParseError(self.where("unterminated `case` item"))
        self.trailing_redirects()

    def cond_command(self) -> None:
        """``[[ … ]]``: operators inside are not command separators; scan the words.

        The operands of ``-eq``/``-lt``/… are evaluated as arithmetic and the operand of
        ``-v``/``-R`` as a (subscripted) name: both are checked like ``$((…))``.
        """
        self.pos += 2
        tokens: list[str | None] = []  # raw source of each word; None for an operator
        spans: list[tuple[int, int]] = []
        while True:
            self.skip_blanks()
            if self.at_end():
                raise ShellParseError("unterminated `[[`")
            if self.peek_word() == "]]":
                self.pos += 2
                break
            op = None
            for cand in ("&&", "||", "|", "(", ")", "<", ">", "!", "\n"):
                if self.src.startswith(cand, self.pos):
                    op = cand
                    break
            if op is not None:
                spans.append((self.pos, self.pos + len(op)))
                self.pos += len(op)
                tokens.append(None)
                continue
            start = self.pos
            self.read_word()
            tokens.append(self.src[start : self.pos])
            spans.append((start, self.pos))
        for i, raw in enumerate(tokens):
            if raw in _COND_ARITH_OPS:
                sides: tuple[int, ...] = (i - 1, i + 1)
            elif raw in _COND_NAME_OPS:
                sides = (i + 1,)
            else:
                continue
            for j in sides:
                operand = tokens[j] if 0 <= j < len(tokens) else ""
                if operand is None:  # bash refuses `[[ 1 -lt ( 2 ) ]]` too
                    raise ShellParseError(self.where(f"an operator next to `{raw}` in `[[ … ]]`"))
                if operand:
                    # `1+(i)` is one operand to bash's arithmetic but not to this scan
                    glued = (j > 0 and tokens[j - 1] is None and spans[j - 1][1] == spans[j][0]) or (
                        j + 1 < len(tokens) and tokens[j + 1] is None
                        and spans[j + 1][0] == spans[j][1]
                    )  # fmt: skip
                    if glued:
                        raise ShellParseError(
                            self.where(f"a parenthesis inside an operand of `{raw}` in `[[ … ]]`")
                        )
                    self.evaluated(operand, f"an operand of `[[ … {raw} … ]]`")
        self.trailing_redirects()

    def arith_command(self) -> None:
        """``(( … ))``: arithmetic in bash, but two nested subshells in dash: judge both."""
        start = self.pos
        self.pos += 2
        self.scan_until_double_paren()
        self.evaluated(self.src[start + 2 : self.pos - 2], "`(( … ))`")
        try:
            # the dash view: names are bash's concern, checked above
            as_subshells = parse(self.src[start + 1 : self.pos - 1], via=self.via,
                                 depth=self.depth + 1, names=Names())  # fmt: skip
        except ShellParseError:
            as_subshells = []
        for cmd in as_subshells:
            self.emit(cmd)
        self.trailing_redirects()

    def scan_until_double_paren(self) -> None:
        depth = 0
        src = self.src
        start = self.pos
        while self.pos < len(src):
            c = src[self.pos]
            if c == "(":
                depth += 1
                self.pos += 1
            elif c == ")":
                if depth == 0:
                    if src.startswith("))", self.pos):
                        self.pos += 2
                        return
                    raise ShellParseError(self.where("unbalanced `)` in arithmetic"))
                depth -= 1
                self.pos += 1
            elif c in "$`'\"\\":
                self.read_word_part(in_dquote=False, sink=[], flags=_Flags())
            else:
                self.pos += 1
        self.pos = start
        raise ShellParseError(self.where("unterminated `((`"))

    def trailing_redirects(self) -> None:
        redirects: list[Redirect] = []
        while True:
            self.skip_blanks()
            r = self.try_redirect()
            if r is None:
                break
            redirects.append(r)
        if redirects:
            self.emit(SimpleCommand(argv=(), redirects=tuple(redirects), via=self.via))

    # ------------------------------------------------------------------ simple commands
    def simple_command(self) -> None:
        argv: list[Word] = []
        assigns: list[tuple[str, Word]] = []
        redirects: list[Redirect] = []
        while True:
            self.skip_blanks()
            if self.at_end():
                break
            r = self.try_redirect()
            if r is not None:
                redirects.append(r)
                continue
            c = self.peek()
            if c in _META:
                if c in "<>" and self.src.startswith("(", self.pos + 1):
                    self.process_substitution()
                    argv.append(Word("<(…)", expands=True))
                    continue
                if c == "(" and argv:
                    raise ShellParseError(self.where("unexpected `(` in a command"))
                break
            if not argv:
                name = self.assignment_prefix()
                if name is not None:
                    if self.peek() == "(":
                        value = self.array_literal()
                    else:
                        value = self.read_word(allow_empty=True)
                    self.names.assigned(name, value, f"`{name}=…`")
                    assigns.append((name, value))
                    continue
            argv.append(self.read_word())
        if not argv and not assigns and not redirects:
            raise ShellParseError(self.where("empty command"))
        self.emit(
            SimpleCommand(
                argv=tuple(argv),
                assignments=tuple(assigns),
                redirects=tuple(redirects),
                via=self.via,
                is_function_body=self.function_depth > 0,
            )
        )

    def assignment_prefix(self) -> str | None:
        """At ``name=``, ``name+=`` or ``name[subscript]=``: consume it, return the name.

        bash reads a subscript up to its matching ``]`` across quotes, blanks and
        separators, then evaluates it: it is checked like ``$((…))``.
        """
        src = self.src
        m = _ASSIGN_RE.match(src, self.pos)
        if m is None:
            return None
        if m.group(2) != "[":
            self.pos = m.end()
            return m.group(1)
        end = _subscript_end(src, m.end() - 1)
        if end < 0:
            return None
        op_end = end + 1 + (2 if src.startswith("+=", end + 1) else 1)
        if src[end + 1 : op_end] not in ("=", "+="):
            return None
        self.evaluated(src[m.end() : end], f"the subscript of `{m.group(1)}[…]=`")
        self.pos = op_end
        return m.group(1)

    def array_literal(self) -> Word:
        self.pos += 1
        while True:
            self.skip_newlines()
            if self.at_end():
                raise ShellParseError("unterminated array assignment")
            if self.peek() == ")":
                self.pos += 1
                return Word("(…)", expands=True)
            if self.peek() == "[":  # ( [subscript]=value … )
                end = _subscript_end(self.src, self.pos)
                if end >= 0 and self.src.startswith(("=", "+="), end + 1):
                    self.evaluated(self.src[self.pos + 1 : end], "an array subscript")
                    self.pos = end + 1
            self.read_word()

    def process_substitution(self) -> None:
        self.pos += 2
        inner = self.child("<(…)")
        inner.parse_list(stop=(")",))
        if inner.peek() != ")":
            raise ShellParseError(self.where("unclosed process substitution"))
        self.pos = inner.pos + 1
        self.merge(inner)

    def merge(self, inner: _Parser) -> None:
        if inner.depth > MAX_DEPTH:
            raise ShellParseError(f"commands nested deeper than {MAX_DEPTH} levels")
        for cmd in inner.out.commands:
            self.emit(cmd)
        self.pending_heredocs.extend(inner.pending_heredocs)

    def try_redirect(self) -> Redirect | None:
        m = _FD_RE.match(self.src, self.pos)
        start = self.pos
        p = m.end() if m else self.pos
        for op in _REDIR_OPS:
            if self.src.startswith(op, p):
                if op in ("<", ">") and self.src.startswith("(", p + 1):
                    return None  # process substitution
                if op == "&>" and p != start:
                    return None
                self.pos = p + len(op)
                self.skip_blanks()
                if op in ("<<", "<<-"):
                    return self.heredoc(op)
                if self.at_end() or self.peek() in _META:
                    raise ShellParseError(self.where(f"redirection {op!r} has no target"))
                return Redirect(op, self.read_word())
        self.pos = start
        return None

    def heredoc(self, op: str) -> Redirect:
        raw_start = self.pos
        word = self.read_word()
        raw = self.src[raw_start : self.pos]
        quoted = any(q in raw for q in "'\"\\")
        if word.expands and not quoted:
            raise ShellParseError(self.where("here-document delimiter with an expansion"))
        self.pending_heredocs.append(
            _Heredoc(word.text, strip_tabs=op == "<<-", expand=not quoted, via=self.via)
        )
        return Redirect(op, Word(word.text))

    def read_heredoc(self, doc: _Heredoc) -> None:
        src = self.src
        while True:
            if self.pos >= len(src):
                raise ShellParseError(f"here-document not terminated by {doc.delimiter!r}")
            end = src.find("\n", self.pos)
            line_end = len(src) if end < 0 else end
            line = src[self.pos : line_end]
            check = line.lstrip("\t") if doc.strip_tabs else line
            if check == doc.delimiter:
                self.pos = line_end + (1 if end >= 0 else 0)
                return
            if doc.expand:
                self.scan_heredoc_line(line_end)
            self.pos = line_end + 1 if end >= 0 else line_end

    def scan_heredoc_line(self, line_end: int) -> None:
        """Run substitutions in an unquoted here-document line ($(…), `…`, ${…})."""
        src = self.src
        while self.pos < line_end:
            c = src[self.pos]
            if c == "\\":
                self.pos += 2
            elif c in "$`":
                self.read_word_part(in_dquote=True, sink=[], flags=_Flags())
                if self.pos > line_end:
                    # a substitution spanning lines: recompute the line end
                    end = src.find("\n", self.pos)
                    line_end = len(src) if end < 0 else end
            else:
                self.pos += 1

    # ------------------------------------------------------------------ words
    def read_word(self, allow_empty: bool = False) -> Word:
        src = self.src
        flags = _Flags()
        text: list[str] = []
        start = self.pos
        while self.pos < len(self.src):
            c = self.src[self.pos]
            if c in _META:
                break
            self.read_word_part(in_dquote=False, sink=text, flags=flags)
        if self.pos == start and not allow_empty:
            raise ShellParseError(self.where("expected a word"))
        if (
            self.pos > start + 1 and src[start] == "{" and src[self.pos - 1] == "}" and "[" in src[start : self.pos]
            and self.peek() in ("<", ">")
        ):  # fmt: skip
            # {a[sub]}>file stores the descriptor in an array element: bash evaluates sub
            raise ShellParseError(self.where("a `{name}` redirection naming an array element"))
        value = "".join(text)
        return Word(value, expands=flags.expands, glob=flags.glob)

    def read_word_part(self, *, in_dquote: bool, sink: list[str], flags: _Flags) -> None:
        """Consume one unit of a word (a char, a quoted string or an expansion)."""
        src = self.src
        c = src[self.pos]
        if c == "\\":
            if self.pos + 1 >= len(src):
                self.pos += 1
                sink.append("\\")
                return
            nxt = src[self.pos + 1]
            self.pos += 2
            if nxt == "\n":
                return
            if in_dquote and nxt not in '$`"\\':
                sink.append("\\" + nxt)
            else:
                sink.append(nxt)
            return
        if c == "'" and not in_dquote:
            end = src.find("'", self.pos + 1)
            if end < 0:
                raise ShellParseError(self.where("unclosed single quote"))
            sink.append(src[self.pos + 1 : end])
            self.pos = end + 1
            return
        if c == '"' and not in_dquote:
            self.pos += 1
            while True:
                if self.pos >= len(src):
                    raise ShellParseError("unclosed double quote")
                if src[self.pos] == '"':
                    self.pos += 1
                    return
                self.read_word_part(in_dquote=True, sink=sink, flags=flags)
        if c == "`":
            self.backtick(sink, flags)
            return
        if c == "$":
            self.dollar(sink, flags, in_dquote)
            return
        if not in_dquote:
            if c in "*?" or c == "[" and _BRACKET_RE.match(src, self.pos):
                flags.glob = True
            elif c == "{" and _BRACE_RE.match(src, self.pos):
                flags.expands = True
        sink.append(c)
        self.pos += 1

    def backtick(self, sink: list[str], flags: _Flags) -> None:
        src = self.src
        i = self.pos + 1
        body: list[str] = []
        while True:
            if i >= len(src):
                raise ShellParseError(self.where("unclosed backtick"))
            ch = src[i]
            if ch == "\\" and i + 1 < len(src) and src[i + 1] in "$`\\\n":
                body.append(src[i + 1])
                i += 2
                continue
            if ch == "`":
                break
            body.append(ch)
            i += 1
        text = src[self.pos : i + 1]
        self.pos = i + 1
        self.sub("".join(body), "`…`")
        flags.expands = True
        sink.append(text)

    def dollar(self, sink: list[str], flags: _Flags, in_dquote: bool) -> None:
        src = self.src
        start = self.pos
        nxt = src[self.pos + 1] if self.pos + 1 < len(src) else ""
        if src.startswith("$((", self.pos):
            self.pos += 3
            self.scan_until_double_paren()
            self.evaluated(src[start + 3 : self.pos - 2], "`$(( … ))`")
            flags.expands = True
            sink.append(src[start : self.pos])
            return
        if nxt == "[":
            # `$[ … ]`, the old arithmetic expansion
            end = _subscript_end(src, self.pos + 1)
            if end < 0:
                raise ShellParseError(self.where("unclosed `$[`"))
            self.evaluated(src[self.pos + 2 : end], "`$[ … ]`")
            self.pos = end + 1
            flags.expands = True
            sink.append(src[start : self.pos])
            return
        if nxt == "(":
            self.pos += 2
            inner = self.child("$(…)")
            inner.parse_list(stop=(")",))
            if inner.peek() != ")":
                raise ShellParseError(self.where("unclosed `$(`"))
            self.pos = inner.pos + 1
            self.merge(inner)
            flags.expands = True
            sink.append(src[start : self.pos])
            return
        if nxt == "{":
            self.pos += 2
            depth = 1
            while True:
                if self.pos >= len(src):
                    raise ShellParseError(self.where("unclosed `${`"))
                ch = src[self.pos]
                if ch == "}":
                    depth -= 1
                    self.pos += 1
                    if depth == 0:
                        break
                elif ch == "{":
                    depth += 1
                    self.pos += 1
                elif ch in "$`\\'\"":
                    if ch == "'" and in_dquote:
                        self.pos += 1
                    else:
                        self.read_word_part(in_dquote=False, sink=[], flags=_Flags())
                else:
                    self.pos += 1
            self.braced(src[start + 2 : self.pos - 1])
            flags.expands = True
            sink.append(src[start : self.pos])
            return
        if nxt == "'" and not in_dquote:
            self.pos += 2
            sink.append(self.ansi_c())
            return
        if nxt == '"' and not in_dquote:
            self.pos += 1  # $"…" is a translated string; read as "…"
            self.read_word_part(in_dquote=False, sink=sink, flags=flags)
            return
        m = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-]").match(src, self.pos + 1)
        if m:
            self.pos = m.end()
            flags.expands = True
            sink.append(src[start : self.pos])
            return
        sink.append("$")
        self.pos += 1

    def braced(self, inner: str) -> None:
        """Check what bash evaluates in ``${inner}``: a subscript, a substring offset and
        length, the name behind ``${!name}``; refuse the ``@P`` transform (it expands the
        value like a prompt, command substitutions included)."""
        m = _BRACED_HEAD_RE.match(inner)
        if m is None or not m.group(2):
            return  # ${#}, ${!}: numbers; anything else bash refuses as a bad substitution
        prefix, name = m.group(1), m.group(2)
        rest = inner[m.end() :]
        subscript: str | None = None
        if rest.startswith("["):
            end = _subscript_end(rest, 0)
            if end < 0:
                raise ShellParseError(self.where(f"unclosed subscript in `${{{inner}}}`"))
            subscript = rest[1:end]
            rest = rest[end + 1 :]
            if subscript not in ("@", "*"):
                self.evaluated(subscript, f"the subscript of `${{{name}[…]}}`")
        if prefix == "!" and not (
            (subscript in ("@", "*") and not rest) or (subscript is None and rest in ("@", "*"))
        ):
            # ${!name}: the value of name is a parameter name, subscripts evaluated
            if not _NAME_RE.fullmatch(name):
                raise ShellParseError(self.where(f"`${{!{name}…}}` names a parameter at run time"))
            self.names.referenced(name, f"`${{!{name}}}`")
        if rest.startswith("@P"):
            raise ShellParseError(
                self.where(f"`${{{inner}}}`: the @P transform runs command substitutions "
                           "found in the value")
            )
        if rest.startswith(":") and rest[1:2] not in ("-", "=", "?", "+"):
            self.evaluated(rest[1:], f"the offset and length of `${{{name}:…}}`")

    def ansi_c(self) -> str:
        """Decode a bash ``$'…'`` string (cursor just past the opening quote)."""
        src = self.src
        out: list[str] = []
        simple = {
            "n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v",
            "e": "\x1b", "E": "\x1b", "\\": "\\", "'": "'", '"': '"', "?": "?",
        }  # fmt: skip
        while True:
            if self.pos >= len(src):
                raise ShellParseError("unclosed $'…' string")
            ch = src[self.pos]
            if ch == "'":
                self.pos += 1
                return "".join(out)
            if ch != "\\":
                out.append(ch)
                self.pos += 1
                continue
            esc = src[self.pos + 1 : self.pos + 2]
            self.pos += 2
            if esc in simple:
                out.append(simple[esc])
            elif esc in ("x", "u", "U"):
                width = {"x": 2, "u": 4, "U": 8}[esc]
                m = re.compile(rf"[0-9A-Fa-f]{{1,{width}}}").match(src, self.pos)
                if not m:
                    raise ShellParseError(self.where(f"bad \\{esc} escape in $'…'"))
                self.pos = m.end()
                out.append(_chr(int(m.group(0), 16)))
            elif esc in "01234567" and esc:
                m = re.compile(r"[0-7]{0,2}").match(src, self.pos)
                digits = esc + (m.group(0) if m else "")
                self.pos += len(digits) - 1
                out.append(_chr(int(digits, 8) & 0xFF))
            elif esc == "c":
                raise ShellParseError(self.where("control-character escape in $'…'"))
            else:
                out.append("\\" + esc)


def _subscript_end(src: str, pos: int) -> int:
    """Index of the ``]`` matching the ``[`` at ``pos`` (quotes skipped), or -1."""
    depth = 0
    i = pos
    n = len(src)
    while i < n:
        c = src[i]
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
            if depth == 0:
                return i
        elif c == "\\":
            i += 1
        elif c == "'":
            i = src.find("'", i + 1)
            if i < 0:
                return -1
        elif c == '"':
            i += 1
            while i < n and src[i] != '"':
                i += 2 if src[i] == "\\" else 1
        i += 1
    return -1


def _chr(code: int) -> str:
    if code == 0:
        raise ShellParseError("NUL in $'…' string")
    try:
        return chr(code)
    except ValueError as exc:
        raise ShellParseError(f"bad character code {code:#x} in $'…' string") from exc


@dataclass
class _Flags:
    expands: bool = False
    glob: bool = False
