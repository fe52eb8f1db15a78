"""Store protocols for durable runs, and the errors they raise.

Each protocol is small and backend-neutral: memory, SQLite, PostgreSQL and Redis implement the
same methods. Every time-dependent method takes an optional ``now`` (epoch seconds; the
backend's clock when ``None``) so tests and reapers can pass the instant they reason about.

Fencing lives in the store: :meth:`EventLog.append` and an :meth:`RunStore.update` carrying
``expect_epoch`` compare the caller's epoch with the record's ``driver_epoch`` inside the same
transaction as the write, so a superseded driver can never land anything.
"""

from __future__ import annotations

import enum
import json
import types
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, runtime_checkable

from corral._errors import CorralError
from corral.stores._records import RunPatch, RunRecord, RunStatus
from corral.stores._records import CorruptRecord

if TYPE_CHECKING:
    from collections.abc import Collection

    from corral.stores._checkpoints import Checkpoint, CheckpointInfo, ChunkStats, ThreadHead

JsonObject: TypeAlias = dict[str, Any]

MAX_SPEC_BYTES = 2 << 20
"""Largest ``spec`` a new run may store (2 MiB of JSON, as stored): the sandbox definition,
argv and options. A ``corral.toml`` is at most 1 MiB; this leaves room for JSON escaping,
and refuses a definition that grows past it rather than storing it in every record."""


# --------------------------------------------------------------------------- errors


class StoreError(CorralError):
    """A store could not do what was asked (the message says why and what to do)."""


class StoreUnavailable(StoreError):
    """The store could not be reached (its server is down or unreachable) for longer than the
    store waits out an outage; nothing was written, and the same call may be retried."""


class SpecTooLarge(StoreError, ValueError):
    """A new run's ``spec`` is larger than :data:`MAX_SPEC_BYTES`; nothing was stored."""


class UnknownRun(StoreError, LookupError):
    """No run with this id exists."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"no run with id {run_id!r} exists in this store")
        self.run_id = run_id


class RunExists(StoreError):
    """``create`` was asked for a run id that is already taken (run ids are unique)."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id!r} already exists; run ids are unique, pick another")
        self.run_id = run_id


class RunActive(StoreError):
    """``delete_run`` was asked to delete a run that has not ended (``running`` or
    ``interrupted``): nothing was deleted. Cancel it, or wait for it to end, first."""

    def __init__(self, run_id: str, status: str) -> None:
        super().__init__(f"run {run_id!r} is {status}, not ended; cancel it (corral cancel "
                         f"{run_id}) or wait for its end before deleting it")
        self.run_id = run_id
        self.status = status


class InvalidEvent(StoreError, ValueError):
    """An event handed to ``append`` is not a JSON object or its journal offset is invalid."""


class LogClosed(StoreError):
    """An append reached a run whose event log is closed (no event may follow a close)."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"the event log of run {run_id!r} is closed; nothing more can be appended")
        self.run_id = run_id


class ClaimLost(StoreError):
    """The caller's claim on a run is no longer current: a newer epoch exists or the lease
    could not be renewed. Nothing was written."""

    def __init__(self, run_id: str, held_epoch: int, observed_epoch: int | str) -> None:
        super().__init__(
            f"claim on run {run_id!r} lost: held epoch {held_epoch}, store has {observed_epoch}; "
            "another driver owns this run now, stop driving it"
        )
        self.run_id = run_id
        self.held_epoch = held_epoch
        self.observed_epoch = observed_epoch


class UnknownApproval(StoreError, LookupError):
    """No approval request with this id exists for this run."""

    def __init__(self, run_id: str, approval_id: str) -> None:
        super().__init__(f"no approval request {approval_id!r} exists for run {run_id!r}")
        self.run_id = run_id
        self.approval_id = approval_id


class ApprovalExists(StoreError):
    """``add_approval`` was given an id this run already has (ids are unique per run)."""

    def __init__(self, run_id: str, approval_id: str) -> None:
        super().__init__(f"run {run_id!r} already has an approval request {approval_id!r}")
        self.run_id = run_id
        self.approval_id = approval_id


class InvalidSession(StoreError, ValueError):
    """A saved CLI session is malformed: an empty or non-text id, a file path that is
    absolute, climbs out (``..``), holds a NUL, or is both a file and a directory."""


class SessionTooLarge(StoreError, ValueError):
    """A saved CLI session is over the store's :class:`SessionLimits`; nothing was written."""


class RefusalReason(enum.StrEnum):
    """Why a claim was refused. A refusal is permanent for that attempt and changed nothing."""

    UNKNOWN = "unknown"
    TERMINAL = "terminal"
    CANCELLED = "cancelled"
    HELD = "held"


class ClaimRefused(StoreError):
    """A claim was refused; the store was not changed (``driver_epoch`` included)."""

    def __init__(self, run_id: str, reason: RefusalReason, detail: str = "") -> None:
        text = f"driver claim not acquired for run {run_id!r}: {reason.value}"
        super().__init__(text + (f" ({detail})" if detail else ""))
        self.run_id = run_id
        self.reason = reason


# --------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class Claim:
    """A lease on a run: who holds it, the epoch it fences with, and when it lapses."""

    run_id: str
    owner: str
    epoch: int
    expires_at: float


@dataclass(frozen=True, slots=True)
class LoggedEvent:
    """One stored event: its log offset (SSE id, from 1, gap-free), the journal byte offset it
    was translated up to, and the event (an AG-UI event as a JSON-able dict, camelCase)."""

    offset: int
    journal_offset: int
    event: JsonObject


@dataclass(frozen=True, slots=True)
class LogTail:
    """The state of a run's log at one instant (for takeover: where to resume the journal)."""

    last_offset: int
    """Offset of the last event, 0 when the log is empty."""
    last_journal_offset: int | None
    """The highest journal offset any logged event carries (where a successor resumes
    the journal); ``None`` when the log is empty. Not simply the last event's: events
    logged out of band (approval requests, file events) carry the offset their driver
    knew, which a concurrent batch may already have passed."""
    closed: bool


@dataclass(frozen=True, slots=True)
class NewRun:
    """What ``create``/``create_or_resume`` store for a new run (status defaults to running)."""

    run_id: str
    thread_id: str
    started_at: float | None = None
    status: RunStatus = RunStatus.RUNNING
    harness: str | None = None
    spec: Mapping[str, Any] | None = None
    sandbox_key: str | None = None
    sandbox_ref: Mapping[str, Any] | None = None
    journal: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        for name in ("run_id", "thread_id"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise StoreError(f"{name} must be a non-empty string, got {value!r}")
        if self.spec is not None:
            try:  # measured as the stores write it (ASCII JSON, compact)
                size = len(json.dumps(self.spec, separators=(",", ":")))
            except (TypeError, ValueError):
                return  # not JSON: the store refuses it, naming the field
            if size > MAX_SPEC_BYTES:
                raise SpecTooLarge(
                    f"run {self.run_id}: its definition (sandbox, argv, options) is "
                    f"{size / (1 << 20):.1f} MiB as stored, over the limit of "
                    f"{MAX_SPEC_BYTES >> 20} MiB; keep data in the workspace, not the definition"
                )

    def record(self, now: float) -> RunRecord:
        started = self.started_at if self.started_at is not None else now
        return RunRecord(
            run_id=self.run_id,
            thread_id=self.thread_id,
            status=self.status,
            started_at=float(started),
            updated_at=float(now),
            harness=self.harness,
            spec=self.spec,
            sandbox_key=self.sandbox_key,
            sandbox_ref=self.sandbox_ref,
            journal=self.journal,
        )


@dataclass(frozen=True, slots=True)
class InstanceRecord:
    """Where a sandbox instance lives, keyed by its instance key.

    ``upsert`` replaces the whole record, so omitted optional fields are cleared.
    ``expires_at`` (epoch seconds) is when an idle instance may be collected.
    """

    key: str
    provider: str
    provider_sandbox_id: str
    thread_id: str
    updated_at: float
    latest_snapshot_id: str | None = None
    latest_run_id: str | None = None
    expires_at: float | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> JsonObject:
        out: JsonObject = {
            "key": self.key,
            "provider": self.provider,
            "provider_sandbox_id": self.provider_sandbox_id,
            "thread_id": self.thread_id,
            "updated_at": self.updated_at,
        }
        for name in ("latest_snapshot_id", "latest_run_id", "expires_at"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.meta:
            out["meta"] = dict(self.meta)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InstanceRecord:
        """Validate a stored instance record; raises :class:`StoreError` naming the field."""

        def s(name: str, required: bool) -> str | None:
            v = data.get(name)
            if v is None and not required:
                return None
            if not isinstance(v, str) or (required and not v):
                raise CorruptRecord(f"instance record: {name} must be a string, got {v!r}")
            return v

        def t(name: str, required: bool) -> float | None:
            v = data.get(name)
            if v is None and not required:
                return None
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise CorruptRecord(f"instance record: {name} must be a number, got {v!r}")
            return float(v)

        meta = data.get("meta") or {}
        if not isinstance(meta, Mapping):
            raise CorruptRecord("instance record: meta must be an object")
        return cls(
            key=s("key", True) or "",
            provider=s("provider", True) or "",
            provider_sandbox_id=s("provider_sandbox_id", True) or "",
            thread_id=s("thread_id", True) or "",
            updated_at=t("updated_at", True) or 0.0,
            latest_snapshot_id=s("latest_snapshot_id", False),
            latest_run_id=s("latest_run_id", False),
            expires_at=t("expires_at", False),
            meta=dict(meta),
        )


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """A pending "ask": a tool call (or command) waiting for a human's allow or deny.

    ``approval_id`` is unique per run (the gate mints signed ids); ``args`` is JSON."""

    approval_id: str
    run_id: str
    tool: str
    args: Any
    created_at: float
    expires_at: float
    call_id: str | None = None

    def __post_init__(self) -> None:
        for name in ("approval_id", "run_id", "tool"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise StoreError(f"approval request: {name} must be a non-empty string, "
                                 f"got {value!r}")


ApprovalDecision: TypeAlias = str
"""``"allow"``, ``"deny"`` or ``"timeout"`` (the gate's own answer when nobody answered)."""

APPROVAL_DECISIONS: frozenset[str] = frozenset({"allow", "deny", "timeout"})


@dataclass(frozen=True, slots=True)
class ApprovalAnswer:
    """The answer to an approval request; the first one stored stands."""

    decision: ApprovalDecision
    reason: str | None
    answered_at: float

    def __post_init__(self) -> None:
        if self.decision not in APPROVAL_DECISIONS:
            raise StoreError(f"approval answer: decision must be one of "
                             f"{sorted(APPROVAL_DECISIONS)}, got {self.decision!r}")


MAX_SESSION_BYTES: int = 256 << 20
"""Default largest saved CLI session (its files' bytes together): 256 MiB."""
MAX_SESSION_FILES: int = 20000
"""Default largest number of files in a saved CLI session."""
MAX_SESSION_PATH: int = 4096


@dataclass(frozen=True, slots=True)
class SessionLimits:
    """How large a saved CLI session a :class:`SessionStore` accepts."""

    max_bytes: int = MAX_SESSION_BYTES
    max_files: int = MAX_SESSION_FILES

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_files"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise StoreError(f"session limits: {name} must be an integer >= 0, "
                                 f"got {value!r}")


def _session_text(what: str, value: object, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not value:
        raise InvalidSession(f"saved session: {what} must be a non-empty string, got {value!r}")
    if "\x00" in value:
        raise InvalidSession(f"saved session: {what} holds a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidSession(f"saved session: {what} is not valid Unicode text") from None


def check_session_path(path: object) -> str:
    """``path`` when it is a safe relative POSIX path (under the sandbox home): a non-empty
    string of at most 4096 characters, no NUL, not absolute, no empty, ``.`` or ``..``
    component. Raises :class:`InvalidSession` naming the problem."""
    if not isinstance(path, str) or not path:
        raise InvalidSession(f"saved session: a file path must be a non-empty string, "
                             f"got {path!r}")
    shown = repr(path[:200])
    if len(path) > MAX_SESSION_PATH:
        raise InvalidSession(f"saved session: file path {shown} is longer than "
                             f"{MAX_SESSION_PATH} characters")
    if "\x00" in path:
        raise InvalidSession(f"saved session: file path {shown} holds a NUL character")
    if path.startswith("/"):
        raise InvalidSession(f"saved session: file path {shown} is absolute; paths are "
                             "relative to the sandbox home")
    if any(part in ("", ".", "..") for part in path.split("/")):
        raise InvalidSession(f"saved session: file path {shown} has an empty, '.' or '..' "
                             "component")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidSession(f"saved session: file path {shown} is not valid Unicode "
                             "text") from None
    return path


@dataclass(frozen=True, slots=True)
class StoredSession:
    """An agent CLI's saved session for one thread and harness: its files (relative POSIX
    paths under the sandbox home, already redacted) and the id the CLI resumes.

    Validated when made (:func:`check_session_path` for every path); ``files`` is copied
    into a read-only mapping, so the caller's dict changing later changes nothing."""

    thread_id: str
    harness: str
    session_id: str | None
    files: Mapping[str, bytes]
    saved_at: float
    run_id: str | None = None

    def __post_init__(self) -> None:
        _session_text("thread_id", self.thread_id)
        _session_text("harness", self.harness)
        _session_text("session_id", self.session_id, optional=True)
        _session_text("run_id", self.run_id, optional=True)
        if isinstance(self.saved_at, bool) or not isinstance(self.saved_at, int | float):
            raise InvalidSession(f"saved session: saved_at must be a number, "
                                 f"got {self.saved_at!r}")
        if not isinstance(self.files, Mapping):
            raise InvalidSession("saved session: files must map paths to bytes")
        files: dict[str, bytes] = {}
        for path, data in self.files.items():
            check_session_path(path)
            if not isinstance(data, bytes | bytearray | memoryview):
                raise InvalidSession(f"saved session: file {path[:200]!r} must be bytes, "
                                     f"got {type(data).__name__}")
            files[path] = bytes(data)
        # a path that is both a file and a directory cannot be written back
        dirs = {p.rsplit("/", i)[0] for p in files for i in range(1, p.count("/") + 1)}
        clash = sorted(dirs & files.keys())
        if clash:
            raise InvalidSession(f"saved session: {clash[0][:200]!r} is both a file and a "
                                 "directory")
        object.__setattr__(self, "saved_at", float(self.saved_at))
        object.__setattr__(self, "files", types.MappingProxyType(files))

    @property
    def size(self) -> int:
        """The files' bytes together."""
        return sum(len(data) for data in self.files.values())

    def info(self) -> SessionInfo:
        """What :meth:`SessionStore.list_sessions` says of this session."""
        return SessionInfo(self.thread_id, self.harness, self.session_id, self.size,
                           len(self.files), self.saved_at, self.run_id)


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A saved session as listed: everything but the files' bytes."""

    thread_id: str
    harness: str
    session_id: str | None
    size: int
    """The files' bytes together."""
    files: int
    """How many files."""
    saved_at: float
    run_id: str | None = None


# --------------------------------------------------------------------------- protocols


@runtime_checkable
class RunStore(Protocol):
    """Run records."""

    async def create(self, new: NewRun, *, now: float | None = None) -> RunRecord:
        """Create a run; raises :class:`RunExists` if the id is taken (nothing changes)."""
        ...

    async def create_or_resume(self, new: NewRun, *, now: float | None = None) -> RunRecord:
        """Create a run, or return the existing one **unchanged** (every field of ``new`` is
        ignored then)."""
        ...

    async def get(self, run_id: str) -> RunRecord | None:
        """The record, or ``None`` for an unknown id."""
        ...

    async def update(
        self,
        run_id: str,
        patch: RunPatch,
        *,
        expect_epoch: int | None = None,
        now: float | None = None,
    ) -> RunRecord | None:
        """Apply ``patch``; returns the new record, ``None`` for an unknown id (a no-op).

        With ``expect_epoch`` the write happens only if the record's ``driver_epoch`` equals
        it, checked in the same transaction; otherwise :class:`ClaimLost` and nothing changes.
        """
        ...

    async def find_active_run(self, thread_id: str) -> RunRecord | None:
        """The newest (by ``started_at``) ``running`` run of the thread, or ``None``."""
        ...

    async def list_by_thread(self, thread_id: str) -> list[RunRecord]:
        """All runs of the thread, oldest first."""
        ...

    async def list_runs(
        self, *, status: RunStatus | None = None, limit: int = 100
    ) -> list[RunRecord]:
        """The newest runs first (by start time), optionally only those with ``status``."""
        ...

    async def list_reclaimable(
        self, now: float, ttl: float, *, limit: int | None = None
    ) -> list[RunRecord]:
        """Running runs unattended since ``now - ttl`` or earlier (inclusive), oldest
        first (ties in creation order), at most ``limit`` of them.

        "Unattended since" is :attr:`RunRecord.unattended_since`: ``detached_since`` when a
        viewer left, else the end of the latest lease. So a run whose driver died without
        detaching (its lease lapsed, or it released its claim and died before the next
        driver took one) is listed too, from the moment its lease ended; a run under a
        live lease and not detached never is, and neither is a run never claimed.

        The order makes a capped sweep make progress: the oldest runs are the first to
        expire and leave the listing. A backend must answer a ``limit`` in time that grows
        with ``limit``, not with the number of detached runs (an index, a ``LIMIT``).
        """
        ...

    async def request_cancel(self, run_id: str, *, now: float | None = None) -> RunRecord | None:
        """Set the sticky ``cancel_requested`` flag atomically (never from a stale read).

        Unknown run → ``None``; a terminal run is returned unchanged.
        """
        ...

    async def delete_run(self, run_id: str) -> bool:
        """Delete an ended run (``completed``, ``failed`` or ``aborted``) and everything that
        belongs to it, in one transaction: its record, its event log and its approval
        requests. Returns whether there was one. A run that has not ended (``running``,
        ``interrupted``) is refused with :class:`RunActive`, checked in the same
        transaction, and nothing is deleted. Afterwards the run is unknown: ``get`` is
        ``None``, ``read`` and ``tail`` raise :class:`UnknownRun` (a tailer of its log
        wakes and raises it too), and its id may be created again, with an empty log."""
        ...


@runtime_checkable
class ClaimStore(Protocol):
    """Leases that decide who drives a run. Each acquisition bumps ``driver_epoch`` by one."""

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
        """Take the lease. Raises :class:`ClaimRefused` (unknown, terminal, cancelled unless
        ``allow_cancelled``, or held by an unexpired lease) having changed nothing.
        ``clear_detached`` clears ``detached_since`` in the same transaction.
        ``break_lease_of``: take the claim even though a live lease exists, but only when
        that lease's owner is exactly this string (compare-and-swap; the caller proved that
        owner dead, or is cancelling). The epoch bump fences the old owner."""
        ...

    async def renew_claim(self, claim: Claim, ttl: float, *, now: float | None = None) -> Claim:
        """Extend the lease; raises :class:`ClaimLost` if ``claim`` is no longer current."""
        ...

    async def release_claim(self, claim: Claim) -> None:
        """Drop the lease if still current (the epoch stays); never raises for a lost claim."""
        ...


@runtime_checkable
class EventLog(Protocol):
    """Per-run append-only event logs."""

    async def append(
        self,
        run_id: str,
        events: Sequence[tuple[Mapping[str, Any], int]],
        *,
        epoch: int,
    ) -> list[int]:
        """Append ``(event, journal_offset)`` pairs atomically; returns their offsets.

        Raises :class:`ClaimLost` if ``epoch`` is not the record's ``driver_epoch``,
        :class:`UnknownRun`, or :class:`LogClosed`; in every such case nothing lands.
        """
        ...

    def read(self, run_id: str, after: int = 0) -> AsyncIterator[LoggedEvent]:
        """Events with offset > ``after``; tails new events until the log is closed.

        Raises :class:`UnknownRun` when the run does not exist.
        """
        ...

    async def close(self, run_id: str, *, epoch: int | None = None) -> bool:
        """Close the log and wake tailers. Never fenced: it never raises for a lost claim.

        A close that carries a superseded ``epoch`` leaves the log open for the driver that
        now owns it (returns ``False``); without ``epoch`` it always closes. Idempotent.
        """
        ...

    async def snapshot(self, run_id: str) -> list[LoggedEvent]:
        """Everything stored right now, in order; never waits; ``[]`` when nothing is."""
        ...

    async def tail(self, run_id: str) -> LogTail:
        """Last offset, last event's journal offset and closed flag, at one instant."""
        ...


@runtime_checkable
class InstanceStore(Protocol):
    """Sandbox instance records (where a reusable sandbox lives)."""

    async def get_instance(self, key: str) -> InstanceRecord | None: ...

    async def upsert_instance(self, record: InstanceRecord) -> None:
        """Full replace: fields omitted from ``record`` are cleared."""
        ...

    async def delete_instance(self, key: str) -> None:
        """Remove the record; a missing key is a no-op."""
        ...

    async def list_expired_instances(self, now: float) -> list[InstanceRecord]:
        """Records with ``expires_at <= now`` (inclusive)."""
        ...


@runtime_checkable
class LockStore(Protocol):
    """Named lease locks for work that must run once across hosts (e.g. the reaper sweep)."""

    async def try_lock(
        self, name: str, owner: str, ttl: float, *, now: float | None = None
    ) -> bool:
        """Take (or, for the same owner, extend) the lock; ``False`` if someone else holds it."""
        ...

    async def unlock(self, name: str, owner: str) -> bool:
        """Release if ``owner`` holds it; returns whether it did."""
        ...


@runtime_checkable
class LocksReadingInstance(Protocol):
    """Optional store capability (a :class:`LockStore` that is an :class:`InstanceStore`):
    take a lock and read an instance record in one transaction, so ``ensure`` takes its key's
    lock and learns the instance in one round trip. Tested with ``isinstance``."""

    async def try_lock_reading_instance(
        self, name: str, owner: str, ttl: float, key: str, *, now: float | None = None
    ) -> tuple[bool, InstanceRecord | None]:
        """:meth:`LockStore.try_lock`, and when it is taken, the instance record ``key`` as
        it is under the lock (``(False, None)`` when someone else holds the lock)."""
        ...


@runtime_checkable
class UpsertsUnlocking(Protocol):
    """Optional store capability (a :class:`LockStore` that is an :class:`InstanceStore`):
    write an instance record and release a lock in one transaction (``ensure``'s last
    record and the release of its key's lock). Tested with ``isinstance``."""

    async def upsert_instance_unlocking(self, record: InstanceRecord, name: str,
                                        owner: str) -> None:
        """:meth:`InstanceStore.upsert_instance`, then :meth:`LockStore.unlock`, at once:
        both happen or neither does."""
        ...


@runtime_checkable
class ApprovalStore(Protocol):
    """Approval requests and their answers, shared by every host of the store: a run driven
    on one host can be answered from any other (``corral approve``, ``POST
    …/approvals/{id}``). Requests are keyed by ``(run_id, approval_id)`` alone: the store
    does not require (or check) a run record for ``run_id``."""

    async def add_approval(self, request: ApprovalRequest) -> None:
        """Store a new, unanswered request; :class:`ApprovalExists` (nothing changes) when
        the run already has one with this id, :class:`StoreError` when ``args`` is not
        JSON. The stored request shares no state with ``request``."""
        ...

    async def answer_approval(
        self, run_id: str, approval_id: str, answer: ApprovalAnswer
    ) -> ApprovalAnswer:
        """Record ``answer`` unless the request is answered already, in one transaction;
        returns the answer that stands (``answer`` when it was first, else the earlier
        one, unchanged). :class:`UnknownApproval` when there is no such request."""
        ...

    async def get_approval(
        self, run_id: str, approval_id: str
    ) -> tuple[ApprovalRequest, ApprovalAnswer | None] | None:
        """The request and its answer (``None`` while pending); ``None`` when unknown."""
        ...

    async def list_pending_approvals(self, run_id: str) -> list[ApprovalRequest]:
        """The run's unanswered requests, oldest first (ties in insertion order)."""
        ...


@runtime_checkable
class SecretStore(Protocol):
    """Host-independent secrets corral itself needs (never a user's secrets): the key that
    signs approval ids and derives per-run tool tokens, so that every host sharing the store
    mints and checks the same values."""

    async def shared_secret(self, name: str) -> bytes:
        """The 32 random bytes named ``name``: made on first use (insert-if-absent, so
        concurrent first callers on different hosts agree) and the same ever after.
        :class:`StoreError` for an empty name."""
        ...


@runtime_checkable
class CheckpointStore(Protocol):
    """Checkpoints of threads' workspaces (#27): content-addressed chunks, shared by every
    checkpoint and thread that holds the same bytes, and per-thread manifests naming them.

    A writer puts its chunks (:meth:`put_chunks`, or learns with :meth:`missing_chunks`
    which it need not put), then the manifest (:meth:`put_checkpoint`), within
    ``grace`` seconds of :meth:`collect_chunks` (see :mod:`corral.stores` checkpoints:
    the collector never removes a chunk a manifest names or a writer put or touched
    lately, and a manifest naming an absent chunk is refused)."""

    async def put_chunks(self, chunks: Mapping[str, bytes], *, now: float | None = None
                         ) -> None:
        """Store ``{digest: data}`` (data opaque to the store, keyed by the SHA-256 hex
        digest the caller computed of the content). Idempotent: a digest already held is
        kept as it is and touched. :class:`StoreError` for a malformed digest."""
        ...

    async def missing_chunks(self, digests: Collection[str], *, now: float | None = None
                             ) -> set[str]:
        """Which of ``digests`` the store does not hold; the ones it holds are touched (so
        the collector keeps them for ``grace`` seconds from ``now``)."""
        ...

    async def get_chunks(self, digests: Collection[str]) -> dict[str, bytes]:
        """``{digest: data}`` for the ``digests`` the store holds (absent ones left out)."""
        ...

    async def put_checkpoint(self, checkpoint: Checkpoint, *, now: float | None = None
                             ) -> None:
        """Store a manifest. :class:`~corral.stores.CheckpointExists` when its id is taken,
        :class:`~corral.stores.MissingChunks` when it names a chunk the store does not
        hold, :class:`~corral.stores.CorruptCheckpoint` when it breaks the manifest rules;
        nothing is stored then. Its chunks are touched."""
        ...

    async def get_checkpoint(self, checkpoint_id: str) -> Checkpoint | None:
        """The manifest (checked again as it is read), or ``None`` for an unknown id."""
        ...

    async def list_checkpoints(self, thread_id: str) -> list[CheckpointInfo]:
        """The thread's checkpoints, oldest first (ties in the order they were put)."""
        ...

    async def delete_checkpoint(self, checkpoint_id: str) -> bool:
        """Remove a manifest (its chunks stay until :meth:`collect_chunks`); whether one
        was there."""
        ...

    async def collect_chunks(self, *, grace: float = 3600.0, now: float | None = None) -> int:
        """Delete the chunks no manifest names and nobody put or touched since ``now -
        grace``; returns how many. Safe while writers run (see the class docstring)."""
        ...

    async def chunk_stats(self) -> ChunkStats:
        """How many chunks are held and their stored bytes."""
        ...


@runtime_checkable
class SessionStore(Protocol):
    """Agent CLIs' saved sessions, one per thread and harness, shared by every host of the
    store: a thread's next turn resumes its conversation on any host, in any sandbox.

    A put replaces the thread's session for that harness whole, in one transaction: a
    concurrent reader gets the old session or the new one, never a mix, and of concurrent
    writers the last to commit wins whole. The store refuses a session over
    :attr:`session_limits` with :class:`SessionTooLarge`, writing nothing. Sessions are
    stored as given: redacting them is the caller's job (corral's agent runtime redacts
    before anything reaches the store)."""

    session_limits: SessionLimits
    """The largest session :meth:`put_session` accepts (settable)."""

    async def put_session(self, session: StoredSession) -> SessionInfo:
        """Store ``session``, replacing the thread's session for its harness (files and
        all); returns it as :meth:`list_sessions` lists it. :class:`SessionTooLarge` or
        :class:`InvalidSession` when refused (nothing written)."""
        ...

    async def get_session(self, thread_id: str, harness: str) -> StoredSession | None:
        """The thread's saved session for ``harness``, or ``None``."""
        ...

    async def list_sessions(self, thread_id: str) -> list[SessionInfo]:
        """The thread's saved sessions (one per harness), by harness name."""
        ...

    async def delete_sessions(self, thread_id: str, harness: str | None = None) -> int:
        """Remove the thread's saved sessions (only ``harness``'s when given); returns how
        many were removed (0 when there were none)."""
        ...


@runtime_checkable
class ThreadStore(Protocol):
    """A thread's current state in one read (#27): what a fresh sandbox of a named thread
    needs before its turn, from any host."""

    async def thread_head(self, thread_id: str, *, but: str | None = None) -> ThreadHead:
        """In one round trip and one snapshot: the thread's newest checkpoint, whole (by
        ``created_at``, ties in the order they were put; what
        :meth:`CheckpointStore.list_checkpoints` lists last), and its newest run other
        than run ``but`` (by ``started_at``, ties in creation order; what
        :meth:`RunStore.list_by_thread` lists last). Either is ``None`` when there is
        none."""
        ...


@runtime_checkable
class Diagnosable(Protocol):
    """A store that can check itself for ``corral doctor``."""

    async def diagnose(self) -> str:
        """One line on what works (backend, schema version, notifications); raises
        :class:`StoreError` naming what does not."""
        ...


@runtime_checkable
class Store(RunStore, ClaimStore, EventLog, InstanceStore, LockStore, ApprovalStore,
            SecretStore, CheckpointStore, SessionStore, ThreadStore, Protocol):
    """Everything durable runs need, as one object (what :func:`corral.stores.open_store`
    returns)."""

    url: str

    async def aclose(self) -> None:
        """Release connections and notification resources."""
        ...
