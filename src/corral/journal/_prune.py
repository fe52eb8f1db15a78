"""Removing journal files that nobody needs any more (knowing nothing of run records: the
caller says, per run id, whether the run ended).

A sandbox reused across runs (``reuse="thread"``) keeps every run's journal files in its
host-private directory (:class:`corral.journal._layout.JournalPaths`). :func:`prune_journals`
sweeps one such directory:

- the files of a run that ended are deleted (its events are in the log);
- the files of a run with no record (an orphan) are deleted only once the newest of them is
  at least ``orphan_ttl`` old (inclusive): a record may be created moments after its files;
- a running or paused run's files, and the files of a run whose supervisor is still alive,
  are kept (a successor may still need every byte);
- a name that does not decode to a run id is never looked up, never deleted (a truncated
  token would name a different, possibly live, run);
- at most ``max_deletes`` runs are deleted per sweep; the rest wait for the next one.

It never raises: every failure is reported in the result.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from corral._log import library_logger
from corral.journal._layout import JournalPaths, encode_run_id, read_status
from corral.journal._supervisor import supervisor_alive

__all__ = [
    "DEFAULT_MAX_DELETES",
    "DEFAULT_ORPHAN_TTL",
    "KeptJournal",
    "PruneResult",
    "RunEnded",
    "decode_run_id",
    "delete_journal",
    "prune_journal_dir",
]

log = library_logger("corral.journal._prune")

DEFAULT_ORPHAN_TTL: Final = 3600.0
"""Seconds an orphan's files must have been untouched before they are deleted."""

DEFAULT_MAX_DELETES: Final = 200
"""Runs whose files one sweep deletes at most."""

_SUFFIXES: Final = tuple(p.name for p in JournalPaths(Path(), "").all())
_HEX: Final = frozenset("0123456789abcdef")
_PASS: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-")


RunEnded = Callable[[str], Awaitable[bool | None]]
"""``run_ended(run_id)``: ``True`` when the run ended, ``False`` while it may go on,
``None`` when no such run is known (an orphan); raising means "could not tell"."""


def decode_run_id(token: str) -> str | None:
    """The run id a journal file token stands for, or ``None`` if it is not exactly what
    :func:`~corral.journal._layout.encode_run_id` produces for some run id (truncated tokens,
    stray characters, bad escapes, invalid UTF-8 and non-canonical spellings included)."""
    if not token or "~" in token:
        return None
    out = bytearray()
    i = 0
    while i < len(token):
        ch = token[i]
        if ch == "_":
            pair = token[i + 1 : i + 3]
            if len(pair) != 2 or not set(pair) <= _HEX:
                return None
            out.append(int(pair, 16))
            i += 3
        elif ch in _PASS:
            out.append(ord(ch))
            i += 1
        else:
            return None
    try:
        run_id = out.decode("utf-8")
    except UnicodeDecodeError:
        return None
    # Canonical only: a spelling encode_run_id would not produce is not ours.
    return run_id if run_id and encode_run_id(run_id) == token else None


def _token_of(name: str) -> str | None:
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    head, marker, pid = name.rpartition(".status.json.tmp")  # the supervisor's temp file
    if marker and pid.isdigit():
        return head
    return None


@dataclass(frozen=True, slots=True)
class KeptJournal:
    """Files left in place and why (``run_id`` is ``None`` when the name did not decode)."""

    run_id: str | None
    names: tuple[str, ...]
    reason: str


@dataclass(slots=True)
class PruneResult:
    """What one sweep of a journal directory did."""

    deleted: list[str] = field(default_factory=list)
    """Run ids whose files were deleted."""
    kept: list[KeptJournal] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


async def prune_journal_dir(
    run_ended: RunEnded,
    directory: str | os.PathLike[str],
    *,
    now: float | None = None,
    orphan_ttl: float = DEFAULT_ORPHAN_TTL,
    max_deletes: int = DEFAULT_MAX_DELETES,
    logger: logging.Logger | None = None,
) -> PruneResult:
    """Delete the journal files in ``directory`` that belong to finished or long-orphaned
    runs (see the module docstring). Never raises."""
    logger = logger or log
    result = PruneResult()
    at = time.time() if now is None else now
    base = Path(directory)
    try:
        names = sorted(entry.name for entry in os.scandir(base))
    except OSError as exc:
        result.failures.append(f"listing {base} failed: {exc.strerror or exc}")
        return result

    groups: dict[str, list[str]] = {}
    for name in names:
        token = _token_of(name)
        if token is None:
            continue  # not a journal file: not ours to judge
        groups.setdefault(token, []).append(name)

    for token, files in groups.items():
        run_id = decode_run_id(token)
        if run_id is None:
            result.kept.append(KeptJournal(None, tuple(files), "undecodable-name"))
            continue
        if len(result.deleted) >= max(0, max_deletes):
            result.kept.append(KeptJournal(run_id, tuple(files), "max-deletes"))
            continue
        reason = await _verdict(run_ended, base, token, run_id, files, at, orphan_ttl, result)
        if reason is not None:
            result.kept.append(KeptJournal(run_id, tuple(files), reason))
            continue
        failed = _delete(base, files)
        if failed:
            result.failures.append(f"deleting the journal of run {run_id!r} failed: {failed}")
            result.kept.append(KeptJournal(run_id, tuple(files), "delete-failed"))
            logger.warning("prune: %s", result.failures[-1])
        else:
            result.deleted.append(run_id)
    return result


def delete_journal(paths: JournalPaths) -> str:
    """Delete the files of one run's journal (a run deleted from the store, whose id may be
    used again: a new run must never find the old one's journal). Never raises: returns
    what failed ("" when nothing did)."""
    return _delete(paths.directory, [p.name for p in paths.all()])


async def _verdict(
    run_ended: RunEnded,
    base: Path,
    token: str,
    run_id: str,
    files: list[str],
    now: float,
    orphan_ttl: float,
    result: PruneResult,
) -> str | None:
    """``None`` to delete, else the reason to keep."""
    paths = JournalPaths(base, token)
    if read_status(paths.status) is not None and supervisor_alive(paths):
        return "supervisor-alive"
    try:
        ended = await run_ended(run_id)
    except Exception as exc:  # noqa: BLE001 - reported, the files are kept
        result.failures.append(f"reading run {run_id!r} failed: {exc}")
        return "store-error"
    if ended is not None:
        return None if ended else "non-terminal"
    newest = _newest_mtime(base, files)
    if newest is None:
        return "age-unknown"
    if newest > now - orphan_ttl:
        return "orphan-too-recent"
    return None


def _newest_mtime(base: Path, files: Iterable[str]) -> float | None:
    newest: float | None = None
    for name in files:
        try:
            mtime = os.lstat(base / name).st_mtime
        except OSError:
            return None
        newest = mtime if newest is None else max(newest, mtime)
    return newest


def _delete(base: Path, files: Iterable[str]) -> str:
    errors = []
    for name in files:
        try:
            if stat.S_ISDIR(os.lstat(base / name).st_mode):
                shutil.rmtree(base / name)  # a file-diff baseline (a git directory)
            else:
                os.unlink(base / name)
        except FileNotFoundError:
            continue
        except OSError as exc:
            errors.append(f"{name}: {exc.strerror or exc}")
    return "; ".join(errors)
