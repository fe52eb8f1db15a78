"""Small validators for definition fields. Each error names the field and the fix."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from corral._durations import parse_duration
from corral._errors import ConfigError
from corral._suggest import did_you_mean

__all__ = [
    "choice",
    "duration",
    "format_size",
    "opt_str",
    "positive_int",
    "size",
    "str_list",
    "str_map",
    "string",
]

T = TypeVar("T", bound=str)

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|[kmgt]b|b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_BINARY = "kmgt"


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
    """Seconds from a number or a string such as ``"90s"``, ``"30m"``, ``"2h"``, ``"7d"`` or
    ``"1h30m"`` (:func:`corral._durations.parse_duration`, the parser of every duration)."""
    if isinstance(value, bool):
        raise ConfigError(f"{field}: expected a duration such as '30m', got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        try:
            seconds = parse_duration(value)
        except ConfigError as exc:  # "field: ..." first: the file's reader finds the line by it
            raise ConfigError(f"{field}: {exc}") from None
    else:
        raise ConfigError(f"{field}: expected a duration such as '30m', got {value!r}")
    if seconds <= 0:
        raise ConfigError(f"{field}: must be greater than zero")
    return seconds


def no_unknown(data: Mapping[str, Any], known: Iterable[str], field: str) -> None:
    """Raise for the first key of ``data`` not in ``known`` (used for dict input)."""
    allowed = set(known)
    for key in data:
        if key not in allowed:
            where = f"{field}.{key}" if field else str(key)
            raise ConfigError(f"unknown key {where!r}{did_you_mean(key, allowed)}; "
                              f"known keys: {', '.join(sorted(allowed))}")


def size(value: object, field: str) -> int:
    """Bytes from an integer or a string such as ``"500MiB"``, ``"2G"``, ``"1.5GB"``.

    ``K``/``KiB``, ``M``/``MiB``, ``G``/``GiB``, ``T``/``TiB`` are powers of 1024;
    ``KB``, ``MB``, ``GB``, ``TB`` powers of 1000."""
    if isinstance(value, bool):
        raise ConfigError(f"{field}: expected a size such as '1GiB', got {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str) and (m := _SIZE_RE.match(value)):
        unit = (m.group(2) or "").lower()
        if unit in _SIZE_UNITS:
            factor = _SIZE_UNITS[unit]
        else:  # k, ki, kib, m, … : binary
            factor = 1024 ** (_BINARY.index(unit[0]) + 1)
        n = int(float(m.group(1)) * factor)
    else:
        raise ConfigError(
            f"{field}: {value!r} is not a size; write a number of bytes or a number with a "
            "unit such as '500MiB', '2GiB' or '1.5GB'"
        )
    if n < 1:
        raise ConfigError(f"{field}: must be greater than zero")
    return n


def format_size(n: int) -> str:
    """``1 GiB``, ``1.5 MiB``, ``512 B``: how sizes appear in messages."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            text = f"{value:.1f}".removesuffix(".0") if unit != "B" else str(n)
            return f"{text} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
