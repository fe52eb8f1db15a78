"""Small validators for definition fields. Each error names the field and the fix."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from corral.errors import ConfigError

__all__ = [
    "choice",
    "duration",
    "opt_str",
    "positive_int",
    "size",
    "str_list",
    "str_map",
    "string",
]

T = TypeVar("T", bound=str)

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)
_SIZE_SHIFT = {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}


def string(value: object, field: str, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{field}: expected a string, got {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise ConfigError(f"{field}: must not be empty")
    return value


def opt_str(value: object, field: str) -> str | None:
    return None if value is None else string(value, field)


def choice(value: object, field: str, options: tuple[T, ...]) -> T:
    if not isinstance(value, str) or value not in options:
        raise ConfigError(f"{field}: must be one of {', '.join(options)}; got {value!r}")
    return value


def str_list(value: object, field: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ConfigError(f"{field}: expected a list of strings, got {type(value).__name__}")
    return tuple(string(v, f"{field}[{i}]") for i, v in enumerate(value))


def str_map(value: object, field: str) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{field}: expected a table of name = string")
    out: dict[str, str] = {}
    for k, v in value.items():
        key = string(k, f"{field} key")
        out[key] = string(v, f"{field}.{key}")
    return out


def positive_int(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{field}: expected a positive integer, got {value!r}")
    return value


def duration(value: object, field: str) -> float:
    """Seconds from a number or a string such as ``"90s"``, ``"30m"``, ``"2h"``, ``"7d"``."""
    if isinstance(value, bool):
        raise ConfigError(f"{field}: expected a duration such as '30m', got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        m = _DURATION_RE.match(value)
        if not m:
            raise ConfigError(
                f"{field}: {value!r} is not a duration; write a number of seconds or "
                "a number with a unit ms, s, m, h or d (e.g. '30m')"
            )
        seconds = float(m.group(1)) * _UNITS[m.group(2)]
    else:
        raise ConfigError(f"{field}: expected a duration such as '30m', got {value!r}")
    if seconds <= 0:
        raise ConfigError(f"{field}: must be greater than zero")
    return seconds


def size(value: object, field: str) -> int:
    """Bytes from an integer or a string such as ``"64M"``, ``"10G"``, ``"512KiB"``
    (binary units: K = 1024)."""
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    elif isinstance(value, str) and (m := _SIZE_RE.match(value)):
        n = int(float(m.group(1)) * (1 << _SIZE_SHIFT[m.group(2).upper()]))
    else:
        raise ConfigError(
            f"{field}: {value!r} is not a size; write a number of bytes or a number with a "
            "unit K, M, G or T (e.g. '64M', '10G')"
        )
    if n <= 0:
        raise ConfigError(f"{field}: must be greater than zero")
    return n


def no_unknown(data: Mapping[str, Any], known: Iterable[str], field: str) -> None:
    """Raise for the first key of ``data`` not in ``known`` (used for dict input)."""
    allowed = set(known)
    for key in data:
        if key not in allowed:
            where = f"{field}.{key}" if field else str(key)
            raise ConfigError(f"unknown key {where!r}; known keys: {', '.join(sorted(allowed))}")
