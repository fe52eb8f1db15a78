"""Backend-neutral state transitions shared by every store backend.

A backend reads the current row inside its transaction (or under its lock), calls one of
these pure functions, and writes the result in the same transaction. Keeping the rules here
means memory, SQLite and PostgreSQL cannot disagree about them. :class:`RunTransitions` is
the run-record half of every store class written once: a backend supplies only how to read
and write one record in one transaction.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from corral.stores._records import RunPatch, RunRecord, RunStatus
from corral.stores._protocols import (
    ApprovalAnswer,
    ApprovalRequest,
    Claim,
    ClaimLost,
    ClaimRefused,
    InvalidEvent,
    LogClosed,
    LoggedEvent,
    InvalidSession,
    RefusalReason,
    SessionLimits,
    SessionTooLarge,
    StoredSession,
    StoreError,
    UnknownRun,
)
from corral.stores._records import CorruptRecord


def check_ttl(ttl: float) -> float:
    """A lease length must be a positive, finite number of seconds."""
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not math.isfinite(ttl) or ttl <= 0:
        raise StoreError(f"lease ttl must be a positive number of seconds, got {ttl!r}")
    return float(ttl)


def check_cap(limit: int | None) -> int | None:
    """A listing cap must be ``None`` (no cap) or an integer >= 0."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise StoreError(f"limit must be an integer >= 0 or None, got {limit!r}")
    return limit


def check_limit(limit: int) -> int:
    """A listing limit must be a whole number from 1 to 10,000."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
        raise StoreError(f"limit must be a whole number from 1 to 10000, got {limit!r}")
    return limit


def claim_transition(
    record: RunRecord | None,
    run_id: str,
    owner: str,
    ttl: float,
    now: float,
    *,
    clear_detached: bool,
    allow_cancelled: bool,
    break_lease_of: str | None = None,
) -> tuple[RunRecord, Claim]:
    """The record after a successful claim, or :class:`ClaimRefused` (nothing to write)."""
    ttl = check_ttl(ttl)
    if not owner:
        raise StoreError("a claim owner must be a non-empty string")
    if record is None:
        raise ClaimRefused(run_id, RefusalReason.UNKNOWN)
    if record.terminal:
        raise ClaimRefused(run_id, RefusalReason.TERMINAL, f"status {record.status.value}")
    if record.cancel_requested is True and not allow_cancelled:
        raise ClaimRefused(run_id, RefusalReason.CANCELLED, "a cancel was requested")
    if record.lease_live(now) and not (
        break_lease_of is not None and record.claim_owner == break_lease_of
    ):
        raise ClaimRefused(
            run_id,
            RefusalReason.HELD,
            f"held by {record.claim_owner!r} at epoch {record.driver_epoch} "
            f"until {record.claim_expires_at}",
        )
    epoch = record.driver_epoch + 1
    expires = now + ttl
    new = replace(
        record,
        driver_epoch=epoch,
        claim_owner=owner,
        claim_expires_at=expires,
        updated_at=now,
        detached_since=None if clear_detached else record.detached_since,
    )
    return new, Claim(run_id=run_id, owner=owner, epoch=epoch, expires_at=expires)


def _current(record: RunRecord | None, claim: Claim) -> None:
    if record is None:
        raise ClaimLost(claim.run_id, claim.epoch, "unknown-run")
    if record.driver_epoch != claim.epoch:
        raise ClaimLost(claim.run_id, claim.epoch, record.driver_epoch)
    if record.claim_owner != claim.owner:
        raise ClaimLost(claim.run_id, claim.epoch, "released")


def renew_transition(
    record: RunRecord | None, claim: Claim, ttl: float, now: float
) -> tuple[RunRecord, Claim]:
    """The record with the lease extended, or :class:`ClaimLost`."""
    ttl = check_ttl(ttl)
    _current(record, claim)
    assert record is not None
    expires = now + ttl
    return (
        replace(record, claim_expires_at=expires, updated_at=now),
        replace(claim, expires_at=expires),
    )


def release_transition(record: RunRecord | None, claim: Claim, now: float) -> RunRecord | None:
    """The record with the lease dropped, or ``None`` when the claim is not current.

    ``claim_expires_at`` becomes the release time (never later than the lease's end): the
    moment nobody drives the run any more, which makes a run whose releasing driver died
    before anyone took it over reapable (:attr:`RunRecord.unattended_since`)."""
    try:
        _current(record, claim)
    except ClaimLost:
        return None
    assert record is not None
    ended = min(now, record.claim_expires_at) if record.claim_expires_at is not None else now
    return replace(record, claim_owner=None, claim_expires_at=ended, updated_at=now)


def reclaimable(record: RunRecord, cutoff: float) -> bool:
    """The ``list_reclaimable`` rule: running, and unattended since ``cutoff`` or earlier
    (inclusive): detached then, or its latest lease ended then."""
    since = record.unattended_since
    return record.status is RunStatus.RUNNING and since is not None and since <= cutoff


def update_transition(
    record: RunRecord | None, run_id: str, patch: RunPatch, expect_epoch: int | None, now: float
) -> RunRecord | None:
    """The patched record; ``None`` for an unknown run; :class:`ClaimLost` on a fence miss."""
    if record is None:
        return None
    if expect_epoch is not None and record.driver_epoch != expect_epoch:
        raise ClaimLost(run_id, expect_epoch, record.driver_epoch)
    return patch.apply(record, now)


def cancel_transition(record: RunRecord | None, now: float) -> RunRecord | None:
    """The record with ``cancel_requested`` set (terminal runs unchanged)."""
    if record is None or record.terminal or record.cancel_requested is True:
        return record
    return replace(record, cancel_requested=True, updated_at=now)


_T = TypeVar("_T")


class RunTransitions:
    """``update``, ``request_cancel``, the claims and ``append`` of a store class (a mixin):
    each of the first reads one run record, applies its transition above and writes the
    result, through the backend's :meth:`_transition`; ``append`` checks the whole batch
    before the backend's :meth:`_append` writes any of it."""

    _clock: Callable[[], float]

    def _now(self, now: float | None) -> float:
        return float(self._clock() if now is None else now)

    async def _transition(
        self, run_id: str, step: Callable[[RunRecord | None], tuple[RunRecord | None, _T]]
    ) -> tuple[RunRecord | None, _T]:
        """In one transaction (or under the store's lock): read ``run_id``'s record
        (``None`` when unknown), call ``step`` on it, and write the record ``step`` returns
        unless that is ``None`` or the record read. Returns the record as stored and the
        rest of ``step``'s answer; when ``step`` raises, nothing is written."""
        raise NotImplementedError

    async def _append(self, run_id: str, encoded: list[tuple[str, int]], epoch: int) -> int:
        """Atomically, if :func:`append_check` allows it: land the ``(JSON text,
        journal_offset)`` pairs of ``encoded`` at the next offsets of ``run_id``'s log and
        wake its readers. Returns the first of those offsets."""
        raise NotImplementedError

    async def append(
        self,
        run_id: str,
        events: Sequence[tuple[Mapping[str, Any], int]],
        *,
        epoch: int,
    ) -> list[int]:
        encoded = encode_events(events)
        first = await self._append(run_id, encoded, epoch)
        return list(range(first, first + len(encoded)))

    async def update(
        self,
        run_id: str,
        patch: RunPatch,
        *,
        expect_epoch: int | None = None,
        now: float | None = None,
    ) -> RunRecord | None:
        at = self._now(now)
        new, _ = await self._transition(
            run_id, lambda old: (update_transition(old, run_id, patch, expect_epoch, at), None))
        return new

    async def request_cancel(self, run_id: str, *, now: float | None = None) -> RunRecord | None:
        at = self._now(now)
        new, _ = await self._transition(run_id, lambda old: (cancel_transition(old, at), None))
        return new

    async def acquire_claim(
        self,
        run_id: str,
        owner: str,
        ttl: float,
        *,
        now: float | None = None,
        clear_detached: bool = False,
        allow_cancelled: bool = False,
        break_lease_of: str | None = None,
    ) -> Claim:
        at = self._now(now)
        _, claim = await self._transition(run_id, lambda old: claim_transition(
            old, run_id, owner, ttl, at, clear_detached=clear_detached,
            allow_cancelled=allow_cancelled, break_lease_of=break_lease_of))
        return claim

    async def renew_claim(self, claim: Claim, ttl: float, *, now: float | None = None) -> Claim:
        at = self._now(now)
        _, renewed = await self._transition(
            claim.run_id, lambda old: renew_transition(old, claim, ttl, at))
        return renewed

    async def release_claim(self, claim: Claim) -> None:
        at = self._now(None)
        await self._transition(claim.run_id, lambda old: (release_transition(old, claim, at), None))


def append_check(current_epoch: int | None, run_id: str, epoch: int, closed: bool) -> None:
    """Raise unless an append at ``epoch`` may land now (unknown → lost → closed).

    ``current_epoch`` is the record's ``driver_epoch`` read in the append's transaction
    (``None`` when the run does not exist)."""
    if current_epoch is None:
        raise UnknownRun(run_id)
    # Epoch 0 means "never claimed": every writer must hold a claim (epoch >= 1).
    if current_epoch != epoch or epoch < 1:
        raise ClaimLost(run_id, epoch, current_epoch)
    if closed:
        raise LogClosed(run_id)


def close_allowed(current_epoch: int | None, epoch: int | None) -> bool:
    """A close carrying a superseded epoch must not end the successor's log."""
    if current_epoch is None:
        return False
    return epoch is None or epoch == current_epoch


def encode_events(events: Sequence[tuple[Mapping[str, Any], int]]) -> list[tuple[str, int]]:
    """Validate a whole batch before anything is written; JSON text + journal offset."""
    out: list[tuple[str, int]] = []
    for index, item in enumerate(events):
        if not isinstance(item, tuple) or len(item) != 2:
            raise InvalidEvent(f"event #{index} must be an (event dict, journal_offset) pair")
        event, journal_offset = item
        if not isinstance(event, Mapping):
            raise InvalidEvent(f"event #{index} must be a dict, got {type(event).__name__}")
        if (
            isinstance(journal_offset, bool)
            or not isinstance(journal_offset, int)
            or journal_offset < 0
        ):
            raise InvalidEvent(
                f"event #{index}: journal_offset must be an integer >= 0, got {journal_offset!r}"
            )
        try:
            text = json.dumps(event, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InvalidEvent(f"event #{index} is not JSON-serializable: {exc}") from None
        out.append((text, journal_offset))
    return out


def decode_event(text: str) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise StoreError("a stored event is not a JSON object; the store is corrupt")
    return value


Fetched = tuple[Sequence[tuple[Any, Any, str]], bool, int]
"""A page of a SQL event log read at one instant: ``(offset, journal_offset, event JSON)``
rows, whether the log is closed, and its last offset."""


async def follow_log(
    run_id: str,
    after: int,
    fetch: Callable[[int], Awaitable[Fetched | None]],
    mark: Callable[[], Callable[[], Awaitable[None]]],
) -> AsyncGenerator[LoggedEvent, None]:
    """A SQL backend's ``read``: the events after ``after``, page by page from
    ``fetch(position)`` (``None``: the run is unknown), until the log is closed and read to
    its end. ``mark()`` is called before each fetch and returns the wait to make when that
    fetch brought nothing new, so a wake-up between the fetch and the wait is not lost."""
    position = max(after, 0)
    while True:
        wait = mark()
        fetched = await fetch(position)
        if fetched is None:
            raise UnknownRun(run_id)
        rows, closed, last = fetched
        for offset, journal_offset, text in rows:
            position = int(offset)
            yield LoggedEvent(position, int(journal_offset), decode_event(text))
        if rows:
            continue
        if closed and position >= last:
            return
        await wait()


def record_to_json(record: RunRecord) -> str:
    """The stored form of a run record; raises :class:`StoreError` if it is not JSON-able."""
    try:
        return json.dumps(record.to_dict(), separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"run {record.run_id!r} has a field that is not JSON: {exc}") from None


def record_roundtrip(record: RunRecord) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(record_to_json(record))
    return parsed


def json_text(value: Mapping[str, Any]) -> str:
    """Compact JSON text for storage; raises :class:`StoreError` for non-JSON values."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"value is not JSON-serializable: {exc}") from None


# ------------------------------------------------------------------ approvals and secrets
# The stored form of an approval request: its id, run and ``created_at`` are columns (keys,
# order); the rest is one JSON object, so a new field needs no schema change.

SECRET_BYTES = 32
"""Length of every secret :meth:`SecretStore.shared_secret` makes."""


def approval_to_json(request: ApprovalRequest) -> str:
    """The request's JSON column; raises :class:`StoreError` when ``args`` is not JSON."""
    try:
        return json.dumps(
            {"tool": request.tool, "args": request.args, "call_id": request.call_id,
             "expires_at": request.expires_at},
            separators=(",", ":"), ensure_ascii=False, allow_nan=False,
        )
    except (TypeError, ValueError) as exc:
        raise StoreError(f"approval request {request.approval_id!r}: args are not JSON: "
                         f"{exc}") from None


def approval_from_json(run_id: str, approval_id: str, created_at: float,
                       text: str) -> ApprovalRequest:
    """Parse a stored request (raises ``CorruptRecord``)."""
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise TypeError("not a JSON object")
        call_id = data.get("call_id")
        return ApprovalRequest(
            approval_id=approval_id, run_id=run_id, tool=str(data["tool"]),
            args=data.get("args"), created_at=float(created_at),
            expires_at=float(data["expires_at"]),
            call_id=None if call_id is None else str(call_id),
        )
    except (ValueError, TypeError, KeyError, StoreError) as exc:
        raise CorruptRecord(f"stored approval request {approval_id!r} of run {run_id!r} is "
                            f"corrupt: {exc}") from None


def answer_from_columns(decision: str | None, reason: str | None,
                        answered_at: float | None) -> ApprovalAnswer | None:
    """The answer stored in an approval row's columns, ``None`` while pending."""
    if decision is None:
        return None
    try:
        return ApprovalAnswer(decision, reason, float(answered_at or 0.0))
    except StoreError as exc:
        raise CorruptRecord(f"a stored approval answer is corrupt: {exc}") from None


def check_secret_name(name: str) -> str:
    """A secret's name: a non-empty string of at most 200 characters."""
    if not isinstance(name, str) or not name or len(name) > 200:
        raise StoreError(f"a secret name must be a non-empty string of at most 200 "
                         f"characters, got {name!r}")
    return name


def checked_session(session: StoredSession, limits: SessionLimits) -> StoredSession:
    """``session`` validated again (a subclass or ``object.__setattr__`` may have got round
    the record's own checks) and measured against ``limits``: :class:`InvalidSession` or
    :class:`SessionTooLarge` (one line: what, how large, the limit) before anything is
    written."""
    if not isinstance(session, StoredSession):
        raise InvalidSession(f"put_session takes a StoredSession, got {type(session).__name__}")
    again = StoredSession(session.thread_id, session.harness, session.session_id,
                          dict(session.files), session.saved_at, session.run_id)
    count, size = len(again.files), again.size
    if count > limits.max_files or size > limits.max_bytes:
        raise SessionTooLarge(
            f"the {again.harness} session of thread {again.thread_id!r} is too large to "
            f"store ({count} files, {size} bytes; the store's limits are "
            f"{limits.max_files} files, {limits.max_bytes} bytes); nothing was written")
    return again


def session_from_rows(thread_id: str, harness: str, session_id: str | None, saved_at: float,
                      run_id: str | None, files: Sequence[tuple[str, bytes]]
                      ) -> StoredSession:
    """A stored session rebuilt from a backend's rows; :class:`CorruptRecord` when the rows
    do not make a valid one (a path edited in the database, a wrong type)."""
    try:
        return StoredSession(thread_id, harness, session_id,
                             {str(p): bytes(d) for p, d in files}, float(saved_at), run_id)
    except (StoreError, TypeError, ValueError) as exc:
        raise CorruptRecord(f"the stored {harness!r} session of thread {thread_id!r} is "
                            f"corrupt: {exc}") from None
