"""Durations: the one parser for every duration corral reads (``corral run --timeout``,
``corral reap --ttl``, ``corral serve --reap-interval``, ``keep_alive`` and ``timeout`` in a
definition). A duration is a bare number of seconds or numbers with units (``500ms``, ``30s``,
``10m``, ``2h``, ``7d``, ``1h30m``)."""

from __future__ import annotations

import re
from typing import Final

from corral._errors import ConfigError

__all__ = ["DURATION_FORMS", "parse_duration"]

DURATION_FORMS: Final = "a number of seconds or a number with a unit, e.g. 30s, 10m, 2h, 7d or 1h30m"

_UNITS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART: Final = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_PARTS: Final = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+")
_NUMBER: Final = re.compile(r"\d+(?:\.\d+)?")
_MAX_SECONDS: Final = 10 * 365 * 86400.0


def parse_duration(text: str, *, what: str = "duration", positive: bool = False) -> float:
    """Seconds in ``text``: a bare number of seconds, or numbers with units (``30s``, ``5m``,
    ``1h``, ``2d``, ``500ms``, ``1h30m``). Raises :class:`~corral.ConfigError` naming ``what``,
    the bad value and the accepted forms; at most 10 years, and more than 0 when
    ``positive`` (a timeout; command-line options take it through
    :func:`corral._cmdline.duration_arg`)."""
    raw = text.strip().lower()
    seconds: float | None = None
    if _NUMBER.fullmatch(raw):
        seconds = float(raw)
    elif _PARTS.fullmatch(raw):
        seconds = sum(float(n) * _UNITS[u] for n, u in _PART.findall(raw))
    if seconds is None:
        raise ConfigError(f"invalid {what} {text!r}: use {DURATION_FORMS}")
    if seconds > _MAX_SECONDS:
        raise ConfigError(f"invalid {what} {text!r}: longer than 10 years; use e.g. 30d")
    if positive and seconds <= 0:
        raise ConfigError(f"invalid {what} {text!r}: must be more than 0")
    return seconds
