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

What bash evaluates inside data is judged by :mod:`corral.policy._shelleval`; words are read
by :mod:`corral.policy._shellwords`; the values a parse yields are
:mod:`corral.policy._shelltree`'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from corral.policy._shelleval import Names
from corral.policy._shelltree import MAX_DEPTH, Redirect, ShellParseError, SimpleCommand, Word
from corral.policy._shellwords import META, NAME_RE, Flags, WordReader, subscript_end

__all__ = ["parse"]

# A subscript holding `$` or a backtick is left to the word reader so that a command
# substitution inside it is seen (bash evaluates subscripts).
_ASSIGN_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\[|\+?=)")
_FD_RE = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*\}|\d*")
_COND_ARITH_OPS = frozenset({"-eq", "-ne", "-lt", "-le", "-gt", "-ge"})
_COND_NAME_OPS = frozenset({"-v", "-R"})
_PLAIN_WORD_RE = re.compile(r"[^\s;&|()<>'\"\\`$]+")
_RESERVED_START = frozenset({"if", "then", "elif", "else", "while", "until", "do", "!", "time"})
_RESERVED_END = frozenset({"fi", "done", "esac", "}"})
_FUNCTION_HEAD_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_.:-]*)[ \t]*\([ \t]*\)")
_REDIR_OPS = ("<<<", "<<-", "&>>", "<<", ">>", "<&", ">&", "<>", ">|", "&>", "<", ">")


@dataclass
class _Heredoc:
    delimiter: str
    strip_tabs: bool
    expand: bool
    via: tuple[str, ...]


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


class _Parser(WordReader):
    """The grammar: lists, pipelines, compound commands, simple commands, redirections."""

    def __init__(self, src: str, via: tuple[str, ...], depth: int, names: Names) -> None:
        super().__init__(src, via, depth, names)
        self.pending_heredocs: list[_Heredoc] = []

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

    def nested_list(self, via: str, unclosed: str) -> None:
        inner = self.child(via)
        inner.parse_list(stop=(")",))
        if inner.peek() != ")":
            raise ShellParseError(self.where(unclosed))
        self.pos = inner.pos + 1
        self.merge(inner)

    def merge(self, inner: _Parser) -> None:
        if inner.depth > MAX_DEPTH:
            raise ShellParseError(f"commands nested deeper than {MAX_DEPTH} levels")
        for cmd in inner.out.commands:
            self.emit(cmd)
        self.pending_heredocs.extend(inner.pending_heredocs)

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
        if end < len(self.src) and self.src[end] not in META:
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
            self.paren_command()
            return
        word = self.peek_word()
        if word == "{":
            self.brace_group()
        elif word in ("!", "time"):
            self.prefixed_command(word, stop)
        elif word == "if":
            self.if_command()
        elif word in ("while", "until"):
            self.while_command(word)
        elif word in ("for", "select"):
            self.for_command(word)
        elif word == "case":
            self.case_command()
        elif word == "[[":
            self.cond_command()
        elif word == "function":
            self.function_keyword(stop)
        elif word in _RESERVED_END or word in ("then", "else", "elif", "do", "in"):
            raise ShellParseError(self.where(f"unexpected {word!r}"))
        elif not self.function_definition(stop):
            self.simple_command()

    def paren_command(self) -> None:
        """``( … )``, a subshell, or ``(( … ))``."""
        if self.peek(2) == "((":
            self.arith_command()
        else:
            self.pos += 1
            self.parse_list(stop=(")",))
            if self.peek() != ")":
                raise ShellParseError(self.where("unclosed `(`"))
            self.pos += 1
        self.trailing_redirects()

    def brace_group(self) -> None:
        self.pos += 1
        self.parse_list(stop=("}",))
        self.expect_word("}")
        self.trailing_redirects()

    def prefixed_command(self, word: str, stop: tuple[str, ...]) -> None:
        """``! cmd``, ``time [-p] cmd``."""
        self.pos += len(word)
        self.skip_blanks()
        if word == "time":
            while self.peek_word() in ("-p", "--"):
                self.pos += 2
                self.skip_blanks()
        self.parse_command(stop)

    def if_command(self) -> None:
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

    def while_command(self, word: str) -> None:
        self.pos += len(word)
        self.loop_depth += 1
        try:
            self.parse_list(stop=("do",))
            self.do_group()
        finally:
            self.loop_depth -= 1

    def function_keyword(self, stop: tuple[str, ...]) -> None:
        """``function name [()] compound``."""
        self.pos += len("function")
        self.skip_blanks()
        name = self.peek_word()
        if name is None or not NAME_RE.fullmatch(name.replace("-", "_").replace(".", "_")):
            raise ShellParseError(self.where("bad function name"))
        self.pos += len(name)
        self.skip_blanks()
        if self.peek(2) == "()":
            self.pos += 2
        self.function_body(stop)

    def function_definition(self, stop: tuple[str, ...]) -> bool:
        """At ``name() compound``: read the definition; False when the cursor is not at one."""
        m = _FUNCTION_HEAD_RE.match(self.src, self.pos)
        if m is None:
            return False
        self.pos = m.end()
        self.function_body(stop)
        return True

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
                if name is None or not NAME_RE.fullmatch(name):
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
            if c in META:
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
        end = subscript_end(src, m.end() - 1)
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
                end = subscript_end(self.src, self.pos)
                if end >= 0 and self.src.startswith(("=", "+="), end + 1):
                    self.evaluated(self.src[self.pos + 1 : end], "an array subscript")
                    self.pos = end + 1
            self.read_word()


    def process_substitution(self) -> None:
        self.pos += 2
        self.nested_list("<(…)", "unclosed process substitution")

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
                if self.at_end() or self.peek() in META:
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
                self.read_word_part(in_dquote=True, sink=[], flags=Flags())
                if self.pos > line_end:
                    # a substitution spanning lines: recompute the line end
                    end = src.find("\n", self.pos)
                    line_end = len(src) if end < 0 else end
            else:
                self.pos += 1
