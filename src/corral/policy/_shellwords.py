"""The shell parser's cursor and word reader: one word, its quotes and expansions.

A word is read to its end whatever it holds: quotes (``'…'``, ``"…"``, ``$'…'``), ``$name``,
``${…}`` (what bash evaluates in it is checked), ``$((…))`` and ``$[…]``, backticks and
``$(…)``. A command substitution is a command list of its own, which the grammar
(:mod:`corral.policy._shellparse`) reads through :meth:`WordReader.sub` and
:meth:`WordReader.nested_list`; every command found is collected by :meth:`WordReader.emit`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from corral.policy._shelleval import Names, check_evaluated
from corral.policy._shelltree import ShellParseError, SimpleCommand, Word

__all__ = ["META", "NAME_RE", "Flags", "WordReader", "subscript_end"]

META = frozenset(" \t\n;&|()<>")
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BRACKET_RE = re.compile(r"\[[^\s;&|()<>]*\]")
_BRACE_RE = re.compile(r"\{[^\s{}]*(,|\.\.)[^\s{}]*\}")
_BRACED_HEAD_RE = re.compile(r"([#!]?)([A-Za-z_][A-Za-z0-9_]*|[0-9]+|[@*#?$!-])?")


@dataclass
class Out:
    commands: list[SimpleCommand] = field(default_factory=list)


class WordReader:
    """A cursor over one command string: words, and the commands found in them.

    The grammar extends it; :meth:`sub` and :meth:`nested_list` are the grammar's, since a
    command substitution holds a command list.
    """

    def __init__(self, src: str, via: tuple[str, ...], depth: int, names: Names) -> None:
        self.src = src
        self.pos = 0
        self.via = via
        self.depth = depth
        self.names = names
        self.out = Out()
        self.function_depth = 0
        self.loop_depth = 0

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

    def emit(self, cmd: SimpleCommand) -> None:
        if self.loop_depth and not cmd.in_loop:
            cmd = SimpleCommand(cmd.argv, cmd.assignments, cmd.redirects, cmd.via,
                                cmd.is_function_body, in_loop=True)  # fmt: skip
        self.out.commands.append(cmd)

    def evaluated(self, text: str, context: str) -> None:
        """``text`` is evaluated by bash as arithmetic: refuse anything but plain
        numbers and names, and show what it assigns (``(( PATH = 1 ))`` sets PATH)."""
        assigned = check_evaluated(text, context, self.names)
        if assigned:
            self.emit(SimpleCommand(
                argv=(), assignments=tuple((n, Word("…", expands=True)) for n in sorted(assigned)),
                via=self.via, is_function_body=self.function_depth > 0,
            ))  # fmt: skip

    def sub(self, text: str, via: str) -> None:
        """Parse a separately quoted string (backticks) as its own command list."""
        raise NotImplementedError

    def nested_list(self, via: str, unclosed: str) -> None:
        """Parse the command list at the cursor up to its ``)``, and step past it."""
        raise NotImplementedError

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
                self.read_word_part(in_dquote=False, sink=[], flags=Flags())
            else:
                self.pos += 1
        self.pos = start
        raise ShellParseError(self.where("unterminated `((`"))

    def read_word(self, allow_empty: bool = False) -> Word:
        src = self.src
        flags = Flags()
        text: list[str] = []
        start = self.pos
        while self.pos < len(self.src):
            c = self.src[self.pos]
            if c in META:
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

    def read_word_part(self, *, in_dquote: bool, sink: list[str], flags: Flags) -> None:
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

    def backtick(self, sink: list[str], flags: Flags) -> None:
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

    def dollar(self, sink: list[str], flags: Flags, in_dquote: bool) -> None:
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
            end = subscript_end(src, self.pos + 1)
            if end < 0:
                raise ShellParseError(self.where("unclosed `$[`"))
            self.evaluated(src[self.pos + 2 : end], "`$[ … ]`")
            self.pos = end + 1
            flags.expands = True
            sink.append(src[start : self.pos])
            return
        if nxt == "(":
            self.pos += 2
            self.nested_list("$(…)", "unclosed `$(`")
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
                        self.read_word_part(in_dquote=False, sink=[], flags=Flags())
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
            end = subscript_end(rest, 0)
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
            if not NAME_RE.fullmatch(name):
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


def subscript_end(src: str, pos: int) -> int:
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
class Flags:
    """What a word's parts showed: an expansion, a glob."""

    expands: bool = False
    glob: bool = False
