"""The rule for run and thread ids, shared by the CLI, the Runner's callers and the HTTP API.

An id is 1 to 128 characters: letters, digits and ``. _ : @ -``, starting with a letter or
digit. So an id cannot be a path (``../x``, ``a/b``), an option (``-x``), or carry
whitespace or control characters into logs, file names or URLs, and it fits in any
column. The server's request models use :data:`ID_PATTERN` as their JSON-schema pattern;
the CLI calls :func:`check_id`.
"""

from __future__ import annotations

import re
from typing import Final

from corral._errors import ConfigError

__all__ = ["ID_PATTERN", "MAX_ID_CHARS", "check_id", "valid_id"]

MAX_ID_CHARS: Final = 128
ID_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$"
_ID_RE: Final = re.compile(ID_PATTERN)


def valid_id(value: object) -> bool:
    """Whether ``value`` is a usable run or thread id."""
    # fullmatch: ``$`` alone would also accept a trailing newline
    return isinstance(value, str) and _ID_RE.fullmatch(value) is not None


def check_id(value: str, what: str = "run id") -> str:
    """``value`` if it is a valid id, else :class:`ConfigError` naming ``what`` and the rule."""
    if valid_id(value):
        return value
    shown = repr(value) if len(value) <= 40 else f"{value[:20]!r}... ({len(value)} characters)"
    raise ConfigError(
        f"{what} {shown} is not allowed: use 1 to {MAX_ID_CHARS} letters, digits or . _ : @ -, "
        "starting with a letter or digit"
    )
