"""The journal's exit sentinel: how the supervisor marks "the agent exited with code N".

Framing. After the agent exits, the supervisor (the journal's only writer) appends, in one
``write``, the *trailer*::

    b"\\n" + SENTINEL + b"\\n"

where ``SENTINEL`` is ``{"corral_exit":1,"code":C,"signal":S,"nonce":"<32 hex>"}`` with
compact separators, ``C`` a non-negative integer (``128 + N`` for a death by signal ``N``)
and ``S`` ``null`` or the signal number. The leading separator is written *always*, so the
journal is ``agent_bytes + b"\\n" + SENTINEL + b"\\n"`` whether or not the agent's output ended
with a newline. Splitting the journal at ``\\n`` therefore gives exactly
``agent_bytes.split(b"\\n")`` followed by the sentinel line, and ``b"\\n".join`` of those
segments is the agent's stdout byte for byte (see :mod:`corral.journal._reader`).

Unforgeable: the nonce is random, handed to the supervisor over an inherited pipe, kept only
in its memory and in the driver's run record; the agent never sees it. A line is the sentinel
only if it matches the exact byte pattern *and* carries this run's nonce (constant-time
comparison) *and* integer fields. Anything else, however similar, is agent output.

This module is stdlib-only: the supervisor process imports it at start-up.
"""

from __future__ import annotations

import hmac
import re
import secrets
from dataclasses import dataclass

__all__ = [
    "NONCE_HEX_LEN",
    "SENTINEL_MAX_LEN",
    "SentinelExit",
    "TIMEOUT_EXIT_CODE",
    "format_trailer",
    "new_nonce",
    "normalize_nonce",
    "parse_sentinel",
]

TIMEOUT_EXIT_CODE = 124
"""The exit status recorded for a command or run stopped by its timeout (the ``exec``
result and a run's sentinel alike), whatever the command's own status would have been."""

NONCE_HEX_LEN = 32
"""Nonce length in lowercase hex characters (128 random bits)."""

_PREFIX = b'{"corral_exit":1,"code":'
_PATTERN = re.compile(
    rb'\{"corral_exit":1,"code":(0|[1-9][0-9]{0,9}),"signal":(null|[1-9][0-9]{0,2}),'
    rb'"nonce":"([0-9a-f]{32})"\}'
)
SENTINEL_MAX_LEN = len(_PREFIX) + 10 + len(b',"signal":') + 4 + len(b',"nonce":"') + 32 + 2
"""No sentinel line is longer than this; longer lines are rejected without a regex."""
_NONCE_RE = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True, slots=True)
class SentinelExit:
    """What a valid sentinel says: ``code`` (``128 + N`` for a signal death) and the signal."""

    code: int
    signal: int | None


def new_nonce() -> str:
    """A fresh random nonce (32 lowercase hex chars). Keep it in the run record only."""
    return secrets.token_hex(NONCE_HEX_LEN // 2)


def normalize_nonce(nonce: str | bytes) -> bytes:
    """Return the nonce as ASCII bytes; raise ``ValueError`` unless it is 32 lowercase hex."""
    text = nonce.decode("ascii", "replace") if isinstance(nonce, bytes) else nonce
    if not _NONCE_RE.fullmatch(text):
        raise ValueError("a journal nonce must be 32 lowercase hex characters (use new_nonce())")
    return text.encode("ascii")


def format_sentinel(nonce: str | bytes, code: int, signal: int | None) -> bytes:
    """The sentinel line without newlines."""
    if isinstance(code, bool) or not 0 <= code < 10**10:
        raise ValueError(f"exit code must be a non-negative integer, got {code!r}")
    sig = b"null" if signal is None else str(int(signal)).encode()
    return (
        _PREFIX
        + str(code).encode()
        + b',"signal":'
        + sig
        + b',"nonce":"'
        + normalize_nonce(nonce)
        + b'"}'
    )


def format_trailer(nonce: str | bytes, code: int, signal: int | None) -> bytes:
    """What the supervisor appends in one write: separator, sentinel, newline."""
    return b"\n" + format_sentinel(nonce, code, signal) + b"\n"


def parse_sentinel(line: bytes | bytearray | memoryview, nonce: bytes) -> SentinelExit | None:
    """Return the exit if ``line`` (no newline) is this run's sentinel, else ``None``.

    ``nonce`` must come from :func:`normalize_nonce`. Fails closed on anything unexpected.
    """
    if len(line) > SENTINEL_MAX_LEN or bytes(line[: len(_PREFIX)]) != _PREFIX:
        return None
    m = _PATTERN.fullmatch(bytes(line))
    if m is None or not hmac.compare_digest(m.group(3), nonce):
        return None
    code = int(m.group(1))
    signal = None if m.group(2) == b"null" else int(m.group(2))
    return SentinelExit(code=code, signal=signal)
