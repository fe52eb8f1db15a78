"""What a command string really runs: parts for the policy to judge.

:func:`command_parts` parses a string (:mod:`corral.policy._shellparse`) and then looks
through programs that run other programs: shells with ``-c`` and ``eval`` (their string
is parsed again), argv wrappers such as ``env``, ``sudo``, ``timeout``, ``nice``,
``xargs``, ``find -exec`` (the wrapped command becomes its own part) and
``watch``/``su -c``/``flock -c`` (their string is parsed again). Every part must pass.

A wrapper's own part is marked ``role="wrapper"``: its verdict comes from deny/ask rules
only (``deny: ["sudo *"]`` works), while allowing it is the inner command's business.
Because option parsing of wrappers is heuristic, a wrapper part also asks the policy to
look for a denied command starting at *any* later word (``scan_suffixes``).
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from corral.policy._shelleval import Names, check_evaluated
from corral.policy._shellparse import parse
from corral.policy._shelltree import MAX_DEPTH, Redirect, ShellParseError, SimpleCommand, Word

__all__ = ["Part", "command_parts", "program_name"]

SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "yash", "posh", "rbash"})

# wrapper -> options that take a separate argument (short and long forms)
_WRAPPER_ARG_OPTS: dict[str, frozenset[str]] = {
    "env": frozenset({"-u", "--unset", "-C", "--chdir", "-S", "--split-string"}),
    "sudo": frozenset({"-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U", "-T", "-R"}),
    "doas": frozenset({"-u", "-C"}),
    "nice": frozenset({"-n", "--adjustment"}),
    "timeout": frozenset({"-s", "--signal", "-k", "--kill-after"}),
    "nohup": frozenset(),
    "setsid": frozenset(),
    "time": frozenset({"-f", "--format", "-o", "--output"}),
    "command": frozenset(),
    "exec": frozenset({"-a"}),
    "builtin": frozenset(),
    "stdbuf": frozenset({"-i", "-o", "-e", "--input", "--output", "--error"}),
    "ionice": frozenset({"-c", "-n", "-p", "-P", "-u", "--class", "--classdata"}),
    "chrt": frozenset({"-T", "-P", "-D"}),
    "taskset": frozenset(),
    "xargs": frozenset(
        {
            "-I",
            "-L",
            "-n",
            "-P",
            "-s",
            "-d",
            "-E",
            "-a",
            "--arg-file",
            "--delimiter",
            "--max-args",
            "--max-procs",
            "--max-lines",
            "--max-chars",
            "--eof",
            "--replace",
            "--process-slot-var",
        }
    ),
    "flock": frozenset({"-w", "--timeout", "-E", "--conflict-exit-code"}),
    "unbuffer": frozenset(),
    "strace": frozenset(
        {"-o", "-e", "-p", "-s", "-u", "-a", "-b", "-E", "-I", "-O", "-P", "-S", "-X"}
    ),
    "ltrace": frozenset({"-o", "-e", "-p", "-s", "-u", "-a", "-n", "-l", "-E", "-x"}),
    "chroot": frozenset({"--userspec", "--groups"}),
    "nsenter": frozenset({"-t", "--target", "-S", "--setuid", "-G", "--setgid", "-r", "-w"}),
    "unshare": frozenset({"--setgroups", "--map-user", "--map-group", "-S", "-G", "-R", "-w"}),
    "firejail": frozenset(),
    "busybox": frozenset(),
    "coproc": frozenset(),
    "runuser": frozenset({"-u", "-g", "-G", "--user", "--group"}),
    "sg": frozenset(),
    "caffeinate": frozenset(),
    "proxychains": frozenset({"-f"}),
    "torsocks": frozenset(),
    "catchsegv": frozenset(),
    "valgrind": frozenset(),
    "faketime": frozenset({"-f"}),
    "fakeroot": frozenset(),
    "sandbox-exec": frozenset({"-f", "-p"}),
    "prlimit": frozenset(),
    "systemd-run": frozenset({"-p", "--property", "-u", "--unit"}),
    "cgexec": frozenset({"-g"}),
    "numactl": frozenset(),
    "schedtool": frozenset(),
}
# wrappers whose first positional is consumed before the command (timeout DURATION, …)
_WRAPPER_LEADING_POSITIONALS: dict[str, int] = {
    "timeout": 1, "chroot": 1, "taskset": 1, "chrt": 1, "flock": 1, "sg": 1, "faketime": 1,
}  # fmt: skip
# options whose value is a shell string run with ``sh -c``
_STRING_OPTS: dict[str, frozenset[str]] = {
    "su": frozenset({"-c", "--command", "--session-command"}),
    "runuser": frozenset({"-c", "--command", "--session-command"}),
    "flock": frozenset({"-c", "--command"}),
    "script": frozenset({"-c", "--command"}),
    "env": frozenset({"-S", "--split-string"}),
    "sg": frozenset(),
}
_FIND_EXEC = frozenset({"-exec", "-execdir", "-ok", "-okdir"})

Role = Literal["command", "wrapper", "assignment", "redirect"]


@dataclass(frozen=True, slots=True)
class Part:
    """One thing the policy must judge."""

    argv: tuple[Word, ...]
    role: Role
    via: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    """Variables set for this command only (``A=b cmd``, ``env A=b cmd``)."""
    sets: tuple[str, ...] = ()
    """Variables set for the rest of the string (bare ``A=b``, ``export A=b``)."""
    writes: tuple[Word, ...] = ()
    """Redirection targets opened for writing."""
    open_tail: bool = False
    """More arguments are appended at run time (``xargs``, ``find -exec … +``)."""
    scan_suffixes: bool = False
    repeats: bool = False
    """In a loop or a function body: it may run after parts written later."""

    @property
    def text(self) -> str:
        """A readable rendering for explanations."""
        words = [w.text if w.dynamic else shlex.quote(w.text) for w in self.argv]
        if self.open_tail:
            words.append("…")
        env = [f"{n}=…" for n in self.env]
        out = " ".join(env + words)
        if self.role == "assignment":
            out = " ".join(f"{n}=…" for n in self.sets)
        if self.writes and not self.argv:
            out = " ".join(f"> {w.text}" for w in self.writes)
        return out

    @property
    def program(self) -> Word | None:
        return self.argv[0] if self.argv else None


def program_name(word: Word) -> str:
    """The name a program word runs as: the basename of a path."""
    return posixpath.basename(word.text) if "/" in word.text else word.text


def command_parts(command: str) -> list[Part]:
    """Every part ``command`` would run, in rough execution order.

    Raises :class:`~corral.policy._shelltree.ShellParseError` when the string (or a
    string it hands to a shell) cannot be read with certainty.
    """
    parts: list[Part] = []
    names = Names()
    for simple in parse(command, names=names):
        _expand_simple(simple, parts, 0, names)
    names.check()
    return parts


def _writes(redirects: tuple[Redirect, ...]) -> tuple[Word, ...]:
    return tuple(r.target for r in redirects if r.writes)


def _expand_simple(cmd: SimpleCommand, out: list[Part], depth: int, names: Names) -> None:
    writes = _writes(cmd.redirects)
    assigned = tuple(name for name, _ in cmd.assignments)
    first = len(out)
    if not cmd.argv:
        if assigned:
            out.append(Part((), "assignment", cmd.via, sets=assigned, writes=writes))
        elif writes:
            out.append(Part((), "redirect", cmd.via, writes=writes))
    else:
        _expand_argv(cmd.argv, cmd.via, assigned, writes, out, depth, names, open_tail=False)
    if cmd.in_loop or cmd.is_function_body:
        out[first:] = [replace(p, repeats=True) for p in out[first:]]


def _reparse(text: str, via: tuple[str, ...], out: list[Part], depth: int, names: Names) -> None:
    if depth > MAX_DEPTH:
        raise ShellParseError(f"commands nested deeper than {MAX_DEPTH} levels")
    for inner in parse(text, via=via, depth=depth + 1, names=names):
        _expand_simple(inner, out, depth + 1, names)


def _expand_argv(
    argv: tuple[Word, ...],
    via: tuple[str, ...],
    env: tuple[str, ...],
    writes: tuple[Word, ...],
    out: list[Part],
    depth: int,
    names: Names,
    *,
    open_tail: bool,
) -> None:
    if depth > MAX_DEPTH:
        raise ShellParseError(f"commands nested deeper than {MAX_DEPTH} levels")
    call = _Call(argv, program_name(argv[0]), via, env, writes, out, depth, names, open_tail)
    if argv[0].dynamic:
        call.command()
        return
    for expand in _EXPANDERS:
        if expand(call):
            return
    call.command()


@dataclass(frozen=True, slots=True)
class _Call:
    """One argv being looked through, and where its parts go."""

    argv: tuple[Word, ...]
    name: str
    via: tuple[str, ...]
    env: tuple[str, ...]
    writes: tuple[Word, ...]
    out: list[Part]
    depth: int
    names: Names
    open_tail: bool

    def command(self, *, scan_suffixes: bool = False) -> None:
        """The argv is a part of its own, judged as a command."""
        self.out.append(Part(self.argv, "command", self.via, env=self.env, writes=self.writes,
                             open_tail=self.open_tail, scan_suffixes=scan_suffixes))  # fmt: skip

    def wrapper(self, open_tail: bool = False) -> None:
        self.out.append(_wrapper(self.argv, self.via, self.env, self.writes, open_tail))

    def reparse(self, text: str, how: str) -> None:
        """``text`` is run as a shell string."""
        _reparse(text, self.via + (how,), self.out, self.depth, self.names)


def _name_builtin(call: _Call) -> bool:
    if call.name not in _NAME_BUILTINS:
        return False
    sets = _name_operands(call.name, call.argv, call.names)
    call.out.append(Part(call.argv, "command", call.via, env=call.env, sets=sets,
                         writes=call.writes))  # fmt: skip
    return True


def _shell_c(call: _Call) -> bool:
    """``sh -c STRING``: the string is parsed again."""
    if call.name not in SHELLS:
        return False
    script = _shell_script(call.argv)
    if script is None:
        return False
    call.wrapper()
    if script.dynamic:
        raise ShellParseError(f"`{call.name} -c` runs a string computed at run time")
    call.reparse(script.text, f"{call.name} -c")
    return True


def _eval(call: _Call) -> bool:
    if call.name != "eval":
        return False
    call.wrapper()
    if any(w.dynamic for w in call.argv[1:]) or call.open_tail:
        raise ShellParseError("`eval` runs a string computed at run time")
    call.reparse(" ".join(w.text for w in call.argv[1:]), "eval")
    return True


def _trap(call: _Call) -> bool:
    """``trap ACTION SIG…`` runs ACTION later, in this shell: it is code, like eval's."""
    if call.name != "trap":
        return False
    call.wrapper()
    args = list(call.argv[1:])
    if args and args[0].text == "--" and not args[0].dynamic:
        args = args[1:]
    listing = any(not w.dynamic and w.text.startswith("-") and w.text not in ("-", "--")
                  for w in args[:1])  # fmt: skip
    if len(args) >= 2 and not listing:
        action = args[0]
        if action.dynamic or call.open_tail:
            raise ShellParseError("`trap` runs a string computed at run time")
        if action.text not in ("", "-"):
            call.reparse(action.text, "trap")
    elif call.open_tail:
        raise ShellParseError("`trap` runs a string computed at run time")
    return True


def _refuse_callbacks(call: _Call) -> bool:
    """A completion command or key binding is code run later: refused."""
    if call.name in ("complete", "compgen", "bind") and any(
        w.dynamic or w.text.startswith(("-C", "-F", "-x")) for w in call.argv[1:]
    ):
        raise ShellParseError(f"`{call.name}` with a command to run later")
    return False


def _watch(call: _Call) -> bool:
    if call.name != "watch":
        return False
    argv = call.argv
    call.wrapper()
    rest = _skip_options(argv, 1, frozenset({"-n", "--interval", "-d", "--differences"}))
    if rest < len(argv):
        if any(w.dynamic for w in argv[rest:]):
            raise ShellParseError("`watch` runs a string computed at run time")
        call.reparse(" ".join(w.text for w in argv[rest:]), "watch")
    return True


def _string_options(call: _Call) -> bool:
    """``su -c STRING``, ``flock -c STRING``, …: each string is parsed again."""
    argv, name = call.argv, call.name
    string_opts = _STRING_OPTS.get(name, frozenset())
    found_string = False
    for i, w in enumerate(argv[1:], start=1):
        value: Word | None = None
        if w.text in string_opts and i + 1 < len(argv):
            value = argv[i + 1]
        else:
            for opt in string_opts:
                if opt.startswith("--") and w.text.startswith(opt + "="):
                    value = Word(w.text[len(opt) + 1 :], w.expands, w.glob)
        if value is not None:
            if value.dynamic:
                raise ShellParseError(f"`{name}` runs a string computed at run time")
            call.reparse(value.text, name)
            found_string = True
    if found_string or name in ("su", "script"):
        # su USER / script FILE: the only command they run is the string (or a shell)
        call.wrapper()
        return True
    return False


def _argv_wrapper(call: _Call) -> bool:
    """``env A=b cmd``, ``sudo cmd``, ``xargs cmd``, …: the wrapped argv is a part too."""
    argv, name = call.argv, call.name
    if name not in _WRAPPER_ARG_OPTS:
        return False
    inner_env = call.env
    i = _skip_options(argv, 1, _WRAPPER_ARG_OPTS.get(name, frozenset()))
    if name == "env":
        while i < len(argv) and "=" in argv[i].text and not argv[i].text.startswith("="):
            inner_env = inner_env + (argv[i].text.split("=", 1)[0],)
            i += 1
            i = _skip_options(argv, i, _WRAPPER_ARG_OPTS["env"])
    elif name == "chrt":
        while i < len(argv) and argv[i].text.isdigit():
            i += 1
    i += _WRAPPER_LEADING_POSITIONALS.get(name, 0)
    if i >= len(argv):
        # nothing wrapped (`sudo -s`, `exec`, bare `xargs`): judge the wrapper itself
        call.command(scan_suffixes=True)
        return True
    call.wrapper(call.open_tail)
    _expand_argv(
        argv[i:], call.via + (name,), inner_env, (), call.out, call.depth + 1, call.names,
        open_tail=call.open_tail or name == "xargs",
    )  # fmt: skip
    return True


_DECLARERS = frozenset({"export", "declare", "typeset", "readonly", "local"})
_NAME_BUILTINS = _DECLARERS | frozenset(
    {"read", "mapfile", "readarray", "printf", "getopts", "wait", "unset", "let", "test", "["}
)
"""Builtins that take variable names (bash evaluates a subscript in one) or arithmetic."""
# options (of the builtins above) that take an argument; the key's own names are marked
_OPTS_WITH_ARG: dict[str, str] = {
    "read": "adinNptu", "mapfile": "dnOsuCc", "readarray": "dnOsuCc", "wait": "p",
    "printf": "v",
}  # fmt: skip
_NAME_OPTS: dict[str, str] = {"read": "a", "wait": "p", "printf": "v"}
_DECL_NAME_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\[.*?\])?(\+?=|\Z)", re.S)


def _name_operands(name: str, argv: tuple[Word, ...], names: Names) -> tuple[str, ...]:
    """Check the names (and arithmetic) a builtin is given; return the names it sets.

    A name operand must be a plain name, or a name with a subscript holding only what
    :func:`check_evaluated` accepts: bash evaluates the subscript (``read 'a[$(id)]'``
    runs ``id``). A name known only at run time could be ``PATH`` or hold a subscript,
    so it cannot be judged.
    """
    if name in ("test", "["):
        _test_operands(name, argv, names)
        return ()
    if name == "let":
        sets: set[str] = set()
        for w in argv[1:]:
            sets |= check_evaluated(w.text, "`let`", names)
        return tuple(sorted(sets))
    i, opts, named = _builtin_options(name, argv)
    operands = _name_words(name, list(argv[i:]), named, names)
    if name in _DECLARERS and ({"n", "i"} & opts) and name != "export":
        raise ShellParseError(
            f"`{name} -{'n' if 'n' in opts else 'i'}`: a nameref or integer variable makes "
            "bash evaluate values assigned or read later"
        )
    functions = name in _DECLARERS | {"unset"} and bool({"f", "F"} & opts)
    return tuple(_check_name(name, w, functions, names) for w in named + operands)


def _test_operands(name: str, argv: tuple[Word, ...], names: Names) -> None:
    """``test -v NAME``: bash evaluates a subscript in NAME."""
    for i in range(2, len(argv)):
        prev, word = argv[i - 1], argv[i]
        if prev.dynamic or prev.text in ("-v", "-R"):  # `-v NAME` (or could be)
            if word.dynamic or "[" in word.text:
                check_evaluated(word.text, f"a name operand of `{name}`", names)


def _builtin_options(name: str, argv: tuple[Word, ...]) -> tuple[int, set[str], list[Word]]:
    """Read a builtin's options: the index of its first operand, the option letters, and
    the names given as option arguments (``read -a NAME``)."""
    named: list[Word] = []
    opts: set[str] = set()
    i = 1
    with_arg = _OPTS_WITH_ARG.get(name, "")
    while i < len(argv):
        w = argv[i]
        if w.text == "--" and not w.dynamic:
            i += 1
            break
        if w.dynamic and w.text.startswith(("-", "+", "$", "`")) and name not in _DECLARERS:
            raise ShellParseError(f"`{name}` is given options or names computed at run time")
        if w.dynamic or not w.text.startswith(("-", "+")) or len(w.text) < 2:
            break
        if name == "printf" and w.text[:2] != "-v":
            break  # printf's first argument is its format
        if name == "getopts":
            break
        for k, c in enumerate(w.text[1:], start=2):
            opts.add(c)
            if c in with_arg:
                arg = w.text[k:]
                if not arg:
                    i += 1
                    if i >= len(argv):
                        raise ShellParseError(f"`{name} -{c}` without its argument")
                    value = argv[i]
                else:
                    value = Word(arg, w.expands, w.glob)
                if c == "C" and name in ("mapfile", "readarray"):
                    raise ShellParseError(f"`{name} -C` runs a callback string as code")
                if c in _NAME_OPTS.get(name, ""):
                    named.append(value)
                break
        i += 1
    return i, opts, named


def _name_words(name: str, operands: list[Word], named: list[Word], names: Names) -> list[Word]:
    """Which of a builtin's operands are names (its implicit one when none is given)."""
    if name == "printf":
        return []  # the format and its arguments
    if name == "getopts":
        if operands[1:2]:
            names.assigned("OPTARG", None, "`getopts`")
        return operands[1:2]  # getopts OPTSTRING NAME [ARG…]
    if name == "wait":
        return []  # job ids
    if name in ("mapfile", "readarray") and not operands:
        return [Word("MAPFILE")]
    if name == "read" and not operands and not named:
        return [Word("REPLY")]
    return operands


def _check_name(name: str, w: Word, functions: bool, names: Names) -> str:
    """Check one name given to builtin ``name``, note the value it gets; return the name."""
    text = w.text
    m = _DECL_NAME_RE.match(text)
    if m is None or "$" in m.group(1):
        raise ShellParseError(f"`{name}` is given {text!r}, not a plain variable name")
    if m.group(2) and not functions:
        check_evaluated(m.group(2)[1:-1], f"the subscript of a name given to `{name}`", names)
    var = m.group(1)
    if functions or name == "unset":
        return var
    if name not in _DECLARERS:
        names.assigned(var, None, f"`{name}`")  # read, mapfile, printf -v, getopts
    elif m.group(3):
        names.assigned(var, Word(text[m.end() :], w.expands, w.glob), f"`{name}`")
    return var


def _wrapper(
    argv: tuple[Word, ...],
    via: tuple[str, ...],
    env: tuple[str, ...],
    writes: tuple[Word, ...],
    open_tail: bool = False,
) -> Part:
    return Part(
        argv, "wrapper", via, env=env, writes=writes, open_tail=open_tail, scan_suffixes=True
    )


def _skip_options(argv: tuple[Word, ...], i: int, with_arg: frozenset[str]) -> int:
    """Index of the first positional at or after ``i``, skipping options (heuristic)."""
    while i < len(argv):
        t = argv[i].text
        if t == "--":
            return i + 1
        if not t.startswith("-") or t == "-" or argv[i].dynamic:
            return i
        if t in with_arg or (t.startswith("--") and "=" not in t and t in with_arg):
            i += 2
            continue
        i += 1
    return i


def _shell_script(argv: tuple[Word, ...]) -> Word | None:
    """The ``-c`` string of a shell invocation, or None when it reads a file or stdin."""
    has_c = False
    i = 1
    while i < len(argv):
        t = argv[i].text
        if t == "--":
            i += 1
            break
        if t in ("-o", "+o", "-O", "+O", "--rcfile", "--init-file"):
            i += 2
            continue
        if t.startswith("--"):
            i += 1
            continue
        if t.startswith(("-", "+")) and len(t) > 1:
            if "c" in t[1:]:
                has_c = True
            i += 1
            continue
        break
    if has_c and i < len(argv):
        return argv[i]
    if has_c:
        raise ShellParseError("shell `-c` without a command string")
    return None


def _find(call: _Call) -> bool:
    """``find … -exec cmd ;``: each executed argv is a part too."""
    if call.name != "find":
        return False
    argv = call.argv
    execs: list[tuple[tuple[Word, ...], bool]] = []
    i = 1
    while i < len(argv):
        if argv[i].text in _FIND_EXEC and not argv[i].dynamic:
            j = i + 1
            while j < len(argv) and argv[j].text not in (";", "+"):
                j += 1
            if j >= len(argv):
                raise ShellParseError(f"`find {argv[i].text}` without a closing `;` or `+`")
            inner = tuple(
                Word(w.text, expands=True) if "{}" in w.text else w for w in argv[i + 1 : j]
            )
            if inner:
                execs.append((inner, argv[j].text == "+"))
            i = j + 1
        else:
            i += 1
    if not execs:
        call.command()
        return True
    call.wrapper(call.open_tail)
    for inner, tail in execs:
        _expand_argv(inner, call.via + ("find -exec",), (), (), call.out, call.depth + 1,
                     call.names, open_tail=tail)  # fmt: skip
    return True


_EXPANDERS: tuple[Callable[[_Call], bool], ...] = (
    _name_builtin, _shell_c, _eval, _trap, _refuse_callbacks, _watch, _find, _string_options,
    _argv_wrapper,
)  # fmt: skip
"""Each looks through one kind of program, in this order; a plain command is none's."""
