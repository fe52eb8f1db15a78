"""Command and capability policy: allow / ask / deny, deny > ask > allow > default.

A command string is split into every part it would run (:mod:`corral.policy._parts`)
and *every* part must pass, so ``allow=["pytest *"]`` does not allow
``pytest; curl x | sh``. :meth:`Policy.evaluate` returns a :class:`Decision` that says
which rule decided and for which part.

Patterns are shell-like word lists. Each word is a glob (``fnmatch``) matched against one
argument; a bare ``*`` word matches any number of arguments (zero included). So
``"pytest *"`` matches ``pytest`` and ``pytest -q tests``; ``"git status"`` matches only
that. A program word without a ``/`` matches by basename.

Matching is asymmetric on purpose, so that uncertainty always lands on the safe side:

* deny and ask rules match when a command *could* match: a word only known at run time
  (``$X``, ``$(…)``) may stand for any words, ``/bin/rm`` is ``rm``, and a wrapper
  (``sudo``, ``timeout 5``, ``xargs``) is looked through;
* allow rules match only when a command *certainly* matches: run-time words are matched
  only by a bare ``*``; ``/usr/bin/git`` counts as ``git`` only for system bin
  directories (``./pytest`` is not ``pytest``); a command that changes ``PATH``,
  ``LD_PRELOAD`` and similar for itself, or after a part of the string that changed them
  (``export PATH=…``, ``alias``, ``source``), is never allowed by a rule.

Strings that cannot be read with certainty get :attr:`Policy.unparseable` (default
``deny``) with the reason. That includes code bash evaluates where a parser sees data
(arithmetic, array subscripts, names given to ``read``/``printf -v``/``declare``/``test -v``,
``${x@P}``) unless it holds only numbers, plain names and operators, and a name bash
evaluates that the string itself sets to something other than a plain number. Builtins
that assign (``read PATH``, ``printf -v PATH``, ``for PATH in``) change later names like
``export`` does; a part in a loop or a function body is tainted by a taint anywhere.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Literal

from corral._errors import ConfigError
from corral.policy._allowlist import parse_allowlist  # the egress proxy's parser too
import corral._validate as v
from corral.policy._parts import Part, command_parts, program_name
from corral.policy._shelltree import ShellParseError, Word

__all__ = ["Decision", "Policy", "Verdict"]

Verdict = Literal["allow", "ask", "deny"]
VERDICTS: tuple[Verdict, ...] = ("allow", "ask", "deny")
_RANK: dict[str, int] = {"allow": 0, "ask": 1, "deny": 2}

TRUSTED_BIN_DIRS = frozenset({"/bin", "/usr/bin", "/usr/local/bin", "/sbin", "/usr/sbin"})
"""Directories whose programs an allow rule may name by basename (read-only in sandboxes)."""

RISKY_ENV = frozenset(
    {
        "PATH", "IFS", "ENV", "BASH_ENV", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND",
        "CDPATH", "GLOBIGNORE", "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME",
        "PYTHONUSERBASE", "PYTEST_ADDOPTS", "PYTEST_PLUGINS", "NODE_OPTIONS", "NODE_PATH",
        "PERL5OPT", "PERL5LIB", "PERLLIB", "RUBYOPT", "RUBYLIB", "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "PAGER", "EDITOR", "VISUAL", "LESSOPEN",
        "LESSCLOSE", "MANPAGER", "BROWSER", "npm_config_script_shell", "TMPDIR", "HOME",
    }
)  # fmt: skip
"""Variables that change which code a program runs (or where it looks for it)."""
RISKY_ENV_PREFIXES = ("LD_", "DYLD_", "GIT_", "BASH_FUNC_", "npm_config_")

_REDEFINERS = frozenset({"alias", "source", ".", "enable", "hash", "shopt", "set"})
"""Builtins after which a later name may mean something else."""

_SAFE_WRITE_TARGETS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty"})


def _risky(name: str) -> bool:
    return name in RISKY_ENV or name.startswith(RISKY_ENV_PREFIXES)


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of evaluating a command (or capability).

    ``rule`` is the rule that decided (``"deny: rm -rf *"``, ``"default"``,
    ``"unparseable"``, ``"file_write"``), ``part`` the command part it decided on, and
    ``reason`` a sentence for humans. ``parts`` holds one decision per part, in order.
    """

    verdict: Verdict
    rule: str
    part: str
    reason: str
    parts: tuple[Decision, ...] = ()

    @property
    def allowed(self) -> bool:
        return self.verdict == "allow"

    def explain(self) -> str:
        """One line: verdict, rule and the part it applied to."""
        return f"{self.verdict} by {self.rule} for `{self.part}`: {self.reason}"


@dataclass(frozen=True, slots=True)
class _Pattern:
    source: str
    words: tuple[str, ...]
    normalized: tuple[str, ...] | None
    """Options split and sorted (``rm -rf`` → ``rm -f -r``), when the pattern has any."""


@dataclass(frozen=True)
class Policy:
    """What the agent may run.

    ``allow``/``ask``/``deny`` are command patterns; ``default`` applies to a command no
    rule matches. ``file_write`` covers files a command redirects into (harnesses map it
    to their own write tools). ``unparseable`` is the verdict for strings that cannot be
    read with certainty.

    ``network`` and ``allow_hosts`` decide egress:

    * ``network = "deny"`` (the default): no network at all;
    * ``network = "allow"`` with ``allow_hosts`` (``host``, ``host:port``, ``host:*``,
      ``*.domain``, IP addresses and networks; see :mod:`corral.net._egress`): the sandbox
      still has no network of its own; agent runs reach exactly those hosts through the
      host-side egress proxy, which answers any other destination with a refusal the agent
      sees, and refuses a name that resolves to a loopback, link-local, private or other
      non-public address unless an entry names that address itself;
    * ``network = "allow"`` without ``allow_hosts``: direct, unrestricted network (the
      escape hatch; prefer an allowlist).
    """

    allow: tuple[str, ...] = ()
    ask: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    default: Verdict = "ask"
    file_write: Verdict = "allow"
    network: Verdict = "deny"
    unparseable: Literal["ask", "deny"] = "deny"
    allow_hosts: Sequence[str] = ()
    _compiled: dict[str, tuple[_Pattern, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        for name in ("allow", "ask", "deny"):
            raw = v.str_list(getattr(self, name), f"policy.{name}")
            object.__setattr__(self, name, raw)
            self._compiled[name] = tuple(
                _compile(p, f"policy.{name}[{i}]") for i, p in enumerate(raw)
            )
        v.choice(self.default, "policy.default", VERDICTS)
        v.choice(self.file_write, "policy.file_write", VERDICTS)
        v.choice(self.network, "policy.network", VERDICTS)
        if self.network == "ask":
            raise ConfigError(
                "policy.network: 'ask' cannot be enforced yet (per-connection approval "
                "needs the egress proxy); use 'allow' or 'deny'"
            )
        v.choice(self.unparseable, "policy.unparseable", ("ask", "deny"))
        hosts = v.str_list(self.allow_hosts, "policy.allow_hosts")
        object.__setattr__(self, "allow_hosts", hosts)
        if hosts:
            _check_hosts(hosts)
            if self.network != "allow":
                raise ConfigError(
                    f"policy.allow_hosts: the hosts are reached through the egress proxy, "
                    f"which needs policy.network = 'allow' (it is {self.network!r}); set "
                    "network = 'allow' or remove allow_hosts"
                )

    @property
    def egress(self) -> bool:
        """Whether agent runs may reach the network at all (directly, or through the
        egress proxy when :attr:`allow_hosts` is set)."""
        return self.network == "allow"

    @property
    def direct_network(self) -> bool:
        """Whether the sandbox itself gets network (``network = "allow"`` without an
        allowlist). With :attr:`allow_hosts` it stays in its own empty network namespace."""
        return self.network == "allow" and not self.allow_hosts

    def to_dict(self) -> dict[str, object]:
        """Plain data (for hashing and ``corral.toml``)."""
        return {
            "allow": list(self.allow),
            "ask": list(self.ask),
            "deny": list(self.deny),
            "default": self.default,
            "file_write": self.file_write,
            "network": self.network,
            "unparseable": self.unparseable,
            "allow_hosts": list(self.allow_hosts),
        }

    # ------------------------------------------------------------------ evaluation
    def evaluate_capability(self, capability: Literal["file_write", "network"]) -> Decision:
        """The decision for a capability (``file_write`` or ``network``)."""
        verdict: Verdict = v.choice(
            getattr(self, capability, None) if capability in ("file_write", "network") else None,
            "capability",
            VERDICTS,
        )
        return Decision(verdict, capability, capability, f"policy.{capability} is {verdict}")

    def evaluate(self, command: str) -> Decision:
        """Decide a command string; every part it would run must pass."""
        try:
            parts = command_parts(command)
        except ShellParseError as exc:
            return Decision(
                self.unparseable,
                "unparseable",
                command,
                f"cannot read the command with certainty ({exc}); "
                f"policy.unparseable is {self.unparseable}",
            )
        if not parts:
            return Decision("allow", "empty", command, "the command runs nothing")
        decisions: list[Decision] = []
        taints = [_taint(part) for part in parts]
        # a part in a loop or a function body may run again after any later part
        anywhere = next((t for t in taints if t is not None), None)
        tainted_by: str | None = None
        for part, taint in zip(parts, taints, strict=True):
            decisions.append(self._judge(part, tainted_by or (anywhere if part.repeats else None)))
            if tainted_by is None:
                tainted_by = taint
        worst = decisions[0]
        for d in decisions[1:]:
            if _RANK[d.verdict] > _RANK[worst.verdict]:
                worst = d
        return Decision(worst.verdict, worst.rule, worst.part, worst.reason, tuple(decisions))

    def _judge(self, part: Part, tainted_by: str | None) -> Decision:
        text = part.text
        write = self._judge_writes(part)
        if part.role in ("assignment", "redirect"):
            return write or Decision("allow", part.role, text, f"a bare {part.role} runs nothing")
        rule = self._rules(part, tainted_by)
        if write is not None and _RANK[write.verdict] > _RANK[rule.verdict]:
            return write
        return rule

    def _judge_writes(self, part: Part) -> Decision | None:
        for target in part.writes:
            if target.dynamic or not _safe_target(target.text):
                if self.file_write == "allow":
                    return None
                return Decision(
                    self.file_write,
                    "file_write",
                    text_or(part),
                    f"writes to {target.text!r} and policy.file_write is {self.file_write}",
                )
        return None

    def _rules(self, part: Part, tainted_by: str | None) -> Decision:
        text = part.text
        candidates = [part.argv]
        if part.scan_suffixes:
            candidates += [part.argv[k:] for k in range(1, len(part.argv))]
        verdicts: tuple[Verdict, ...] = ("deny", "ask")
        for verdict in verdicts:
            for pattern in self._compiled[verdict]:
                for argv in candidates:
                    if argv and _possibly_matches(pattern, argv, part.open_tail):
                        shown = text if argv is part.argv else _render(argv)
                        return Decision(
                            verdict,
                            f"{verdict}: {pattern.source}",
                            shown,
                            f"`{shown}` matches {verdict} rule {pattern.source!r}",
                        )
        if part.role == "wrapper":
            return Decision(
                "allow", "wrapper", text, "runs another command, which is judged on its own"
            )
        prog = part.argv[0]
        if prog.dynamic:
            return Decision(
                self.unparseable,
                "unparseable",
                text,
                f"the program name {prog.text!r} is only known at run time; "
                f"policy.unparseable is {self.unparseable}",
            )
        blocker = _allow_blocker(part, tainted_by)
        for pattern in self._compiled["allow"]:
            if _matches(pattern.words, part.argv, part.open_tail, certain=True):
                if blocker:
                    return Decision(
                        self.default,
                        "default",
                        text,
                        f"allow rule {pattern.source!r} matches but {blocker}; "
                        f"policy.default is {self.default}",
                    )
                return Decision(
                    "allow", f"allow: {pattern.source}", text,
                    f"`{text}` matches allow rule {pattern.source!r}",
                )  # fmt: skip
        return Decision(
            self.default, "default", text, f"no rule matches; policy.default is {self.default}"
        )


def _check_hosts(hosts: tuple[str, ...]) -> None:
    for i, entry in enumerate(hosts):
        try:
            parse_allowlist([entry])
        except ConfigError as exc:
            raise ConfigError(
                f"policy.allow_hosts[{i}]: {exc}; write 'host', 'host:port', 'host:*', "
                "'*.domain' or an IP address or network ('10.0.0.0/8:5432')"
            ) from None


def text_or(part: Part) -> str:
    return part.text


def _render(argv: tuple[Word, ...]) -> str:
    return " ".join(w.text if w.dynamic else shlex.quote(w.text) for w in argv)


def _safe_target(path: str) -> bool:
    return path in _SAFE_WRITE_TARGETS or path.startswith("/dev/fd/")


def _taint(part: Part) -> str | None:
    """If this part can change what later names mean, say how."""
    risky = [n for n in part.sets if _risky(n)]
    if risky:
        return f"`{part.text}` earlier in the command sets {', '.join(risky)}"
    if part.argv and not part.argv[0].dynamic and program_name(part.argv[0]) in _REDEFINERS:
        name = program_name(part.argv[0])
        if name == "set" and all(
            w.text.startswith(("-e", "-u", "-x", "-o")) for w in part.argv[1:]
        ):
            return None  # `set -euxo pipefail` changes no names
        return f"`{part.text}` earlier in the command can redefine names"
    return None


def _allow_blocker(part: Part, tainted_by: str | None) -> str | None:
    risky = [n for n in part.env if _risky(n)]
    if risky:
        return f"it sets {', '.join(risky)} for the program"
    return tainted_by


def _compile(pattern: str, field_name: str) -> _Pattern:
    try:
        words = tuple(shlex.split(pattern, comments=False, posix=True))
    except ValueError as exc:
        raise ConfigError(f"{field_name}: cannot read pattern {pattern!r}: {exc}") from None
    if not words:
        raise ConfigError(f"{field_name}: empty pattern")
    has_options = any(_is_option(w) for w in words[1:])
    normalized = _normalize(words) if has_options else None
    return _Pattern(pattern, words, normalized)


def _is_option(word: str) -> bool:
    return word.startswith("-") and len(word) > 1 and word != "--"


def _split_option(word: str) -> list[str]:
    if len(word) > 2 and word[1] != "-" and word[1:].isalpha():
        return [f"-{c}" for c in word[1:]]  # -rf -> -r -f
    return [word]


def _normalize(words: tuple[str, ...]) -> tuple[str, ...]:
    """Program, then its options split and sorted, then the other words in order."""
    opts: set[str] = set()
    rest: list[str] = []
    for w in words[1:]:
        if _is_option(w):
            opts.update(_split_option(w))
        else:
            rest.append(w)
    return (words[0], *sorted(opts), *rest)


def _normalize_argv(argv: tuple[Word, ...]) -> tuple[Word, ...]:
    opts: set[str] = set()
    rest: list[Word] = []
    for w in argv[1:]:
        if not w.dynamic and _is_option(w.text):
            opts.update(_split_option(w.text))
        else:
            rest.append(w)
    return (argv[0], *(Word(o) for o in sorted(opts)), *rest)


def _possibly_matches(pattern: _Pattern, argv: tuple[Word, ...], open_tail: bool) -> bool:
    """Deny/ask matching: as written, or with options split and reordered on both sides
    (``rm -r -f /`` and ``rm / -fr`` are ``rm -rf /``)."""
    if _matches(pattern.words, argv, open_tail, certain=False):
        return True
    if pattern.normalized is None:
        return False
    return _matches(pattern.normalized, _normalize_argv(argv), open_tail, certain=False)


def _matches(
    pattern: tuple[str, ...], argv: tuple[Word, ...], open_tail: bool, *, certain: bool
) -> bool:
    """Does ``pattern`` match ``argv`` (certainly, or possibly)?"""
    words = argv + ((Word("…", expands=True),) if open_tail else ())
    memo: dict[tuple[int, int], bool] = {}

    def m(i: int, j: int) -> bool:
        key = (i, j)
        if key in memo:
            return memo[key]
        if i == len(pattern):
            if certain:
                res = j == len(words)
            else:
                res = all(w.expands for w in words[j:])
        elif pattern[i] == "*":
            res = m(i + 1, j) or (j < len(words) and m(i, j + 1))
        elif j == len(words):
            res = False
        else:
            w = words[j]
            if w.expands:
                # certain: only a bare `*` may stand for a run-time value
                res = False if certain else (m(i, j + 1) or m(i + 1, j) or m(i + 1, j + 1))
            else:
                res = _word_matches(pattern[i], w, j == 0, certain) and m(i + 1, j + 1)
        memo[key] = res
        return res

    return m(0, 0)


def _word_matches(pat: str, w: Word, is_program: bool, certain: bool) -> bool:
    text = w.text
    if is_program:
        if "/" in pat:
            target = posixpath.normpath(text) if "/" in text else text
            return _glob_eq(pat, target, w.glob, certain)
        if "/" in text:
            norm = posixpath.normpath(text)
            if certain and posixpath.dirname(norm) not in TRUSTED_BIN_DIRS:
                return False
            text = posixpath.basename(norm)
        return _glob_eq(pat, text, w.glob, certain)
    return _glob_eq(pat, text, w.glob, certain)


def _glob_eq(pat: str, text: str, is_glob: bool, certain: bool) -> bool:
    if fnmatchcase(text, pat):
        return True
    # an unquoted glob word may expand to something the pattern matches
    return is_glob and not certain and fnmatchcase(pat, text)
