"""In-memory store: one process, one event loop. For tests and throwaway runs.

Every method does its whole read-check-write without an ``await`` in between, so each one is
atomic with respect to other tasks on the loop, which is what the fencing rules need.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Self, TypeVar

from corral.stores._records import RunRecord, RunStatus
from corral.stores._protocols import (
    ApprovalAnswer,
    ApprovalExists,
    ApprovalRequest,
    InstanceRecord,
    LoggedEvent,
    LogTail,
    NewRun,
    RunActive,
    RunExists,
    SessionInfo,
    SessionLimits,
    StoredSession,
    UnknownApproval,
    UnknownRun,
)
from corral.stores import _logic
from corral.stores._signal import LocalSignal
from corral.stores._checkpoints import ThreadHead, manifest_from_bytes
from corral.stores._memory_checkpoints import CheckpointState, MemoryCheckpoints

_T = TypeVar("_T")


def _frozen(record: RunRecord) -> RunRecord:
    """A copy sharing no mutable state with the caller (and proven JSON-able, like SQL)."""
    return RunRecord.from_dict(_logic.record_roundtrip(record))


@dataclass
class _Log:
    events: list[tuple[int, str]] = field(default_factory=list)  # (journal_offset, json text)
    closed: bool = False
    high_journal: int | None = None  # the highest journal offset logged


class MemoryStore(_logic.RunTransitions, MemoryCheckpoints):
    """All store protocols in process memory (``memory://``)."""

    url = "memory://"

    def __init__(self, clock: Callable[[], float] = time.time, *,
                 session_limits: SessionLimits | None = None) -> None:
        self._clock = clock
        self.session_limits = session_limits or SessionLimits()
        self._sessions: dict[tuple[str, str], StoredSession] = {}
        self._runs: dict[str, RunRecord] = {}
        self._logs: dict[str, _Log] = {}
        self._instances: dict[str, InstanceRecord] = {}
        self._locks: dict[str, tuple[str, float]] = {}
        # (run_id, approval_id) -> (request as stored, answer); dict order is insertion order
        self._approvals: dict[tuple[str, str], tuple[str, float, ApprovalAnswer | None]] = {}
        self._secrets: dict[str, bytes] = {}
        self._checkpoint_state = CheckpointState()
        self._signal = LocalSignal()

    async def _transition(
        self, run_id: str, step: Callable[[RunRecord | None], tuple[RunRecord | None, _T]]
    ) -> tuple[RunRecord | None, _T]:
        old = self._runs.get(run_id)
        new, rest = step(old)  # no await from the read to the write: atomic on the loop
        if new is not None and new is not old:
            new = self._runs[run_id] = _frozen(new)
        return new, rest

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def diagnose(self) -> str:
        """Always fine; nothing survives the process."""
        return "memory: this process only, nothing is kept"

    async def aclose(self) -> None:
        """Nothing to release."""

    # ------------------------------------------------------------------ runs

    async def create(self, new: NewRun, *, now: float | None = None) -> RunRecord:
        if new.run_id in self._runs:
            raise RunExists(new.run_id)
        return self._insert(new, now)

    async def create_or_resume(self, new: NewRun, *, now: float | None = None) -> RunRecord:
        existing = self._runs.get(new.run_id)
        if existing is not None:
            return existing
        return self._insert(new, now)

    def _insert(self, new: NewRun, now: float | None) -> RunRecord:
        record = new.record(self._now(now))
        record = _frozen(record)
        self._runs[new.run_id] = record
        self._logs[new.run_id] = _Log()
        return record

    async def get(self, run_id: str) -> RunRecord | None:
        return self._runs.get(run_id)

    async def find_active_run(self, thread_id: str) -> RunRecord | None:
        best: RunRecord | None = None
        for record in self._runs.values():  # insertion order breaks started_at ties
            if (
                record.thread_id == thread_id
                and record.status is RunStatus.RUNNING
                and (best is None or record.started_at >= best.started_at)
            ):
                best = record
        return best

    async def list_by_thread(self, thread_id: str) -> list[RunRecord]:
        runs = [r for r in self._runs.values() if r.thread_id == thread_id]
        return sorted(runs, key=lambda r: r.started_at)

    async def list_runs(
        self, *, status: RunStatus | None = None, limit: int = 100
    ) -> list[RunRecord]:
        limit = _logic.check_limit(limit)
        runs = [r for r in self._runs.values() if status is None or r.status is status]
        return sorted(runs, key=lambda r: r.started_at, reverse=True)[:limit]

    async def list_reclaimable(
        self, now: float, ttl: float, *, limit: int | None = None
    ) -> list[RunRecord]:
        cutoff = now - ttl
        count = _logic.check_cap(limit)
        found = [r for r in self._runs.values() if _logic.reclaimable(r, cutoff)]
        # Stable sort: ties keep creation (insertion) order, as in SQLite.
        found.sort(key=lambda r: r.unattended_since or 0.0)
        return found if count is None else found[:count]

    async def delete_run(self, run_id: str) -> bool:
        record = self._runs.get(run_id)
        if record is None:
            return False
        if not record.status.terminal:
            raise RunActive(run_id, record.status.value)
        del self._runs[run_id]
        self._logs.pop(run_id, None)
        for key in [k for k in self._approvals if k[0] == run_id]:
            del self._approvals[key]
        self._signal.notify()  # a tailer of its log looks again, and finds it gone
        return True

    async def thread_head(self, thread_id: str, *, but: str | None = None) -> ThreadHead:
        last: RunRecord | None = None
        for record in self._runs.values():  # insertion order breaks started_at ties
            if record.thread_id == thread_id and record.run_id != but and (
                    last is None or record.started_at >= last.started_at):
                last = record
        newest: tuple[float, bytes] | None = None
        for tid, data, created in self._checkpoint_state.manifests.values():  # put order
            if tid == thread_id and (newest is None or created >= newest[0]):
                newest = (created, data)
        return ThreadHead(None if newest is None else manifest_from_bytes(newest[1]), last)

    # ------------------------------------------------------------------ event log

    async def _append(self, run_id: str, encoded: list[tuple[str, int]], epoch: int) -> int:
        log = self._logs.get(run_id)
        record = self._runs.get(run_id)
        _logic.append_check(
            None if record is None else record.driver_epoch,
            run_id,
            epoch,
            log is not None and log.closed,
        )
        assert log is not None
        first = len(log.events) + 1
        log.events.extend((journal_offset, text) for text, journal_offset in encoded)
        for _text, journal_offset in encoded:
            log.high_journal = max(journal_offset, log.high_journal or 0)
        if encoded:
            self._signal.notify()
        return first

    async def read(self, run_id: str, after: int = 0) -> AsyncIterator[LoggedEvent]:
        if run_id not in self._runs:
            raise UnknownRun(run_id)
        position = max(after, 0)
        while True:
            seen = self._signal.generation
            log = self._logs.get(run_id)
            if log is None:  # deleted meanwhile
                raise UnknownRun(run_id)
            while position < len(log.events):
                journal_offset, text = log.events[position]
                position += 1
                yield LoggedEvent(position, journal_offset, _logic.decode_event(text))
            if log.closed:
                return
            await self._signal.wait(seen, timeout=60.0)

    async def close(self, run_id: str, *, epoch: int | None = None) -> bool:
        log = self._logs.get(run_id)
        record = self._runs.get(run_id)
        current = None if record is None else record.driver_epoch
        if log is None or not _logic.close_allowed(current, epoch):
            return False
        if not log.closed:
            log.closed = True
            self._signal.notify()
        return True

    async def snapshot(self, run_id: str) -> list[LoggedEvent]:
        log = self._logs.get(run_id)
        if log is None:
            return []
        return [
            LoggedEvent(index, journal_offset, _logic.decode_event(text))
            for index, (journal_offset, text) in enumerate(log.events, start=1)
        ]

    async def tail(self, run_id: str) -> LogTail:
        log = self._logs.get(run_id)
        if log is None:
            if run_id not in self._runs:
                raise UnknownRun(run_id)
            return LogTail(0, None, False)
        return LogTail(len(log.events), log.high_journal, log.closed)

    # ------------------------------------------------------------------ instances

    async def get_instance(self, key: str) -> InstanceRecord | None:
        return self._instances.get(key)

    async def upsert_instance(self, record: InstanceRecord) -> None:
        # Round-trip through the dict form so the stored copy shares nothing with the caller.
        self._instances[record.key] = InstanceRecord.from_dict(record.to_dict())

    async def delete_instance(self, key: str) -> None:
        self._instances.pop(key, None)

    async def list_expired_instances(self, now: float) -> list[InstanceRecord]:
        return [
            r for r in self._instances.values() if r.expires_at is not None and r.expires_at <= now
        ]

    # ------------------------------------------------------------------ named locks

    async def try_lock(
        self, name: str, owner: str, ttl: float, *, now: float | None = None
    ) -> bool:
        ttl = _logic.check_ttl(ttl)
        at = self._now(now)
        held = self._locks.get(name)
        if held is not None and held[0] != owner and held[1] > at:
            return False
        self._locks[name] = (owner, at + ttl)
        return True

    async def unlock(self, name: str, owner: str) -> bool:
        held = self._locks.get(name)
        if held is None or held[0] != owner:
            return False
        del self._locks[name]
        return True

    # ------------------------------------------------------------------ approvals

    async def add_approval(self, request: ApprovalRequest) -> None:
        text = _logic.approval_to_json(request)  # stored as JSON, like SQL: no shared state
        key = (request.run_id, request.approval_id)
        if key in self._approvals:
            raise ApprovalExists(request.run_id, request.approval_id)
        self._approvals[key] = (text, request.created_at, None)

    async def answer_approval(
        self, run_id: str, approval_id: str, answer: ApprovalAnswer
    ) -> ApprovalAnswer:
        stored = self._approvals.get((run_id, approval_id))
        if stored is None:
            raise UnknownApproval(run_id, approval_id)
        text, created_at, prior = stored
        if prior is not None:
            return prior
        self._approvals[(run_id, approval_id)] = (text, created_at, answer)
        return answer

    async def get_approval(
        self, run_id: str, approval_id: str
    ) -> tuple[ApprovalRequest, ApprovalAnswer | None] | None:
        stored = self._approvals.get((run_id, approval_id))
        if stored is None:
            return None
        text, created_at, answer = stored
        return _logic.approval_from_json(run_id, approval_id, created_at, text), answer

    async def list_pending_approvals(self, run_id: str) -> list[ApprovalRequest]:
        pending = [
            _logic.approval_from_json(rid, aid, created_at, text)
            for (rid, aid), (text, created_at, answer) in self._approvals.items()
            if rid == run_id and answer is None
        ]
        return sorted(pending, key=lambda r: r.created_at)  # stable: ties keep insertion order

    # ------------------------------------------------------------------ secrets

    async def shared_secret(self, name: str) -> bytes:
        _logic.check_secret_name(name)
        return self._secrets.setdefault(name, secrets.token_bytes(_logic.SECRET_BYTES))

    # ------------------------------------------------------------------ saved sessions

    async def put_session(self, session: StoredSession) -> SessionInfo:
        stored = _logic.checked_session(session, self.session_limits)  # a private copy
        self._sessions[(stored.thread_id, stored.harness)] = stored
        return stored.info()

    async def get_session(self, thread_id: str, harness: str) -> StoredSession | None:
        return self._sessions.get((thread_id, harness))  # immutable: safe to hand out

    async def list_sessions(self, thread_id: str) -> list[SessionInfo]:
        return [s.info() for (t, _h), s in sorted(self._sessions.items()) if t == thread_id]

    async def delete_sessions(self, thread_id: str, harness: str | None = None) -> int:
        keys = [k for k in self._sessions if k[0] == thread_id and harness in (None, k[1])]
        for key in keys:
            del self._sessions[key]
        return len(keys)
