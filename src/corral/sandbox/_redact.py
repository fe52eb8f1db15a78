"""Redaction of live secret values from text, bytes and JSON-like data.

A :class:`Redactor` knows secret values and the common encodings a value leaks in:
URL-quoting, JSON escaping, hex, and base64 (standard and URL-safe, at each of the three
byte alignments a value can have inside a longer base64 blob). Every match becomes
``[REDACTED:NAME]``.

:func:`live_redactor` returns a redactor over every :class:`~corral.sandbox._secrets.Secrets`
object alive in this process, and :func:`get_logger` gives a logger whose records are
redacted by it, so corral's own log lines cannot carry a value.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
import threading
import weakref
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any, Protocol
from urllib.parse import quote, quote_plus

from corral._log import library_logger

__all__ = ["Redactor", "get_logger", "live_redactor", "register_live"]

MIN_ENCODED_LEN = 6
"""Encoded variants shorter than this are not redacted (too likely to hit other text)."""


def _b64_cores(raw: bytes) -> list[str]:
    """Substrings present in any base64 text that contains ``raw`` at any alignment."""
    cores: list[str] = []
    n = len(raw)
    for k in range(3):
        enc = base64.b64encode(b"\0" * k + raw).decode("ascii")
        first = -(-8 * k // 6)  # first char made only of secret bits
        last = (8 * (k + n)) // 6  # chars before this hold only secret bits
        core = enc[first:last]
        if len(core) >= MIN_ENCODED_LEN:
            cores.append(core)
            cores.append(core.replace("+", "-").replace("/", "_"))
    return cores


def variants(value: str) -> set[str]:
    """The value and the encodings it commonly leaks in."""
    raw = value.encode("utf-8")
    out = {value}
    encoded = {
        quote(value, safe=""),
        quote_plus(value, safe=""),
        json.dumps(value)[1:-1],
        json.dumps(value, ensure_ascii=False)[1:-1],
        binascii.hexlify(raw).decode("ascii"),
        binascii.hexlify(raw).decode("ascii").upper(),
        *_b64_cores(raw),
    }
    out.update(e for e in encoded if len(e) >= MIN_ENCODED_LEN)
    return {v for v in out if v}


class _HasSecretValues(Protocol):
    def _redaction_items(self) -> Iterable[tuple[str, str]]: ...


class Redactor:
    """Replaces known secret values (and their encodings) with ``[REDACTED:NAME]``."""

    def __init__(self, secrets: Mapping[str, str] | Iterable[tuple[str, str]] = ()) -> None:
        self._lock = threading.RLock()
        self._values: dict[str, str] = {}  # variant -> name
        self._raw: list[tuple[str, str]] = []
        # values of followed sources, computed once (secrets are immutable)
        self._followed: dict[
            int, tuple[weakref.ref[_HasSecretValues], dict[str, str], list[tuple[str, str]]]
        ] = {}
        self._compiled: tuple[re.Pattern[str] | None, re.Pattern[bytes] | None, dict[str, str]]
        self._compiled = (None, None, {})
        self._dirty = True
        items = secrets.items() if isinstance(secrets, Mapping) else secrets
        for name, value in items:
            self.add(name, value)

    def add(self, name: str, value: str) -> None:
        """Learn one more secret value."""
        if not value:
            return
        with self._lock:
            for variant in variants(value):
                self._values.setdefault(variant, name)
            self._raw.append((name, value))
            self._dirty = True

    def follow(self, source: _HasSecretValues) -> None:
        """Also redact every value ``source`` holds, for as long as it lives."""
        key = id(source)

        def gone(_: object, key: int = key) -> None:
            with self._lock:
                self._followed.pop(key, None)
                self._dirty = True

        table: dict[str, str] = {}
        raw = list(source._redaction_items())
        for name, value in raw:
            for variant in variants(value):
                table.setdefault(variant, name)
        with self._lock:
            self._followed[key] = (weakref.ref(source, gone), table, raw)
            self._dirty = True

    def _compile(self) -> tuple[re.Pattern[str] | None, re.Pattern[bytes] | None, dict[str, str]]:
        with self._lock:
            if not self._dirty:
                return self._compiled
            values = dict(self._values)
            for _, table, _raw in self._followed.values():
                for variant, name in table.items():
                    values.setdefault(variant, name)
            ordered = sorted(values, key=len, reverse=True)
            if ordered:
                pattern = re.compile("|".join(map(re.escape, ordered)))
                bpattern = re.compile(b"|".join(re.escape(o.encode("utf-8")) for o in ordered))
                self._compiled = (pattern, bpattern, values)
            else:
                self._compiled = (None, None, values)
            self._dirty = False
            return self._compiled

    def items(self) -> list[tuple[str, str]]:
        """``(name, value)`` of every secret known (for leak scans; handle with care)."""
        with self._lock:
            out = list(self._raw)
            for _, _table, raw in self._followed.values():
                out.extend(raw)
        return out

    def values(self) -> set[str]:
        """Every string this redactor hides (for scanning tests)."""
        return set(self._compile()[2])

    def table(self) -> dict[str, str]:
        """``{hidden string: secret name}`` for every value and encoding this redactor hides
        (handed to the journal supervisor, which redacts the agent's output in memory)."""
        return dict(self._compile()[2])

    def redact(self, text: str) -> str:
        """``text`` with every known value replaced."""
        pattern, _, values = self._compile()
        if pattern is None or not text:
            return text
        return pattern.sub(lambda m: f"[REDACTED:{values[m.group(0)]}]", text)

    def redact_bytes(self, data: bytes) -> bytes:
        """Bytes version of :meth:`redact` (for journals and raw output)."""
        _, bpattern, values = self._compile()
        if bpattern is None or not data:
            return data
        return bpattern.sub(
            lambda m: f"[REDACTED:{values[m.group(0).decode('utf-8')]}]".encode(), data
        )

    def redact_obj(self, obj: Any) -> Any:
        """A copy of JSON-like data with every string (keys included) redacted."""
        if isinstance(obj, str):
            return self.redact(obj)
        if isinstance(obj, bytes):
            return self.redact_bytes(obj)
        if isinstance(obj, Mapping):
            return {self.redact_obj(k): self.redact_obj(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return (
                type(obj)(self.redact_obj(v) for v in obj)
                if isinstance(obj, tuple)
                else [self.redact_obj(v) for v in obj]
            )
        return obj

    def __bool__(self) -> bool:
        return self._compile()[0] is not None


_LIVE = Redactor()


def register_live(source: _HasSecretValues) -> None:
    """Make ``source``'s values known to :func:`live_redactor` while it is alive."""
    _LIVE.follow(source)


def live_redactor() -> Redactor:
    """The process-wide redactor over every live ``Secrets`` object."""
    return _LIVE


class _RedactingAdapter(logging.LoggerAdapter[logging.Logger]):
    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        return msg, kwargs

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if not self.isEnabledFor(level):
            return
        text = str(msg) % args if args else str(msg)
        kwargs.setdefault("stacklevel", 2)
        self.logger.log(level, "%s", _LIVE.redact(text), **kwargs)


def get_logger(name: str) -> logging.LoggerAdapter[logging.Logger]:
    """A logger whose messages pass the live redactor before they are emitted."""
    return _RedactingAdapter(library_logger(name), {})
