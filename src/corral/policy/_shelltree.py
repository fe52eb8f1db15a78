"""What the shell parser yields: words, redirections, simple commands, and its error.

:mod:`corral.policy._shellparse` reads a command string into these values;
:mod:`corral.policy._parts` looks through them for the programs a string really runs.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from corral._errors import CorralError

__all__ = ["MAX_DEPTH", "Redirect", "ShellParseError", "SimpleCommand", "Word"]

MAX_DEPTH = 16
"""Nesting limit for substitutions and re-parsed strings (``bash -c``, ``eval``)."""


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

