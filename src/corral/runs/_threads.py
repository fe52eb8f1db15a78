"""Threads (#27): list them, show one, undo its last turn, fork it, remove it.

A thread is a conversation with an agent over one workspace, turn after turn; each turn is
a run with the thread's id. Its state lives in the store (see
:mod:`corral.sandbox._threads`): the runs and their logs, the agent CLI's saved session
(the conversation) and a checkpoint of the workspace after every turn. :class:`Threads`
offers the operations ``corral threads``, the HTTP API and the page use.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from corral._errors import CorralError
from corral._ids import check_id
from corral._log import library_logger
from corral.journal._exit_probe import JournalLocationError, locate_journal
from corral.journal._prune import delete_journal
from corral.runs._spec import harness_for_record
from corral.sandbox._checkpoint import restore_checkpoint
from corral.sandbox._contracts import Provider
from corral.sandbox._ensure import key_lock
from corral.sandbox._threads import copy_checkpoint, last_turn_recorded, session_of
from corral.stores._checkpoints import Checkpoint, CheckpointInfo
from corral.stores._protocols import RunActive, SessionInfo, Store
from corral.stores._records import RunPatch, RunRecord
from corral.runs._session_lost import forget_sessions, new_conversation

if TYPE_CHECKING:
    from corral.runs._runner import Runner

__all__ = [
    "ThreadBusy",
    "ThreadDetail",
    "ThreadError",
    "ThreadSummary",
    "Threads",
    "UnknownThread",
]

log = library_logger("corral.runs._threads")

TITLE_CHARS = 80
"""A thread's title: its first prompt (or command), cut to this many characters."""
_PROMPT_EVENT = "corral.prompt"


class ThreadError(CorralError):
    """A thread operation cannot be done (the message says why and what to do)."""

    code = "thread_error"


class UnknownThread(ThreadError, LookupError):
    """No run, checkpoint or saved session has this thread id."""

    code = "not_found"

    def __init__(self, thread_id: str) -> None:
        super().__init__(f"no thread {thread_id!r} in this store (corral threads ls lists "
                         "them)")
        self.thread_id = thread_id


class ThreadBusy(ThreadError):
    """A run of the thread is active: its state cannot change under it."""

    code = "thread_busy"

    def __init__(self, thread_id: str, run_id: str) -> None:
        super().__init__(f"thread {thread_id!r} has an active run ({run_id}); wait for it "
                         f"to end or cancel it (corral cancel {run_id}) first")
        self.thread_id = thread_id
        self.run_id = run_id


@dataclass(frozen=True, slots=True)
class ThreadSummary:
    """One line of a thread list: newest activity first."""

    thread_id: str
    runs: int
    last_status: str
    last_activity: float
    harness: str | None
    title: str
    active_run: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"thread_id": self.thread_id, "runs": self.runs,
                "last_status": self.last_status, "last_activity": self.last_activity,
                "harness": self.harness, "title": self.title,
                "active_run": self.active_run}


@dataclass(frozen=True, slots=True)
class ThreadDetail:
    """A thread: its runs (oldest first), checkpoints (oldest first; the last is the
    thread's current state) and saved sessions."""

    thread_id: str
    runs: list[RunRecord]
    checkpoints: list[CheckpointInfo]
    sessions: list[SessionInfo]
    titles: dict[str, str] = field(default_factory=dict)

    @property
    def head(self) -> CheckpointInfo | None:
        """The checkpoint that holds the thread's current state."""
        return self.checkpoints[-1] if self.checkpoints else None

    def to_dict(self) -> dict[str, Any]:
        head = self.head
        return {
            "thread_id": self.thread_id,
            "runs": [_run_dict(r, self.titles.get(r.run_id, "")) for r in self.runs],
            "checkpoints": [{
                "checkpoint_id": c.checkpoint_id, "run_id": c.run_id,
                "created_at": c.created_at, "bytes": c.total_bytes,
                "entries": c.entry_count, "session": c.has_session,
                "parent_id": c.parent_id,
            } for c in self.checkpoints],
            "head": head.checkpoint_id if head is not None else None,
            "sessions": [{"harness": s.harness, "session_id": s.session_id, "bytes": s.size,
                          "files": s.files, "saved_at": s.saved_at, "run_id": s.run_id}
                         for s in self.sessions],
        }


def _run_dict(r: RunRecord, title: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "run_id": r.run_id, "status": r.status.value, "harness": r.harness,
        "started_at": r.started_at, "finished_at": r.finished_at, "title": title,
    }
    if r.error is not None:
        out["error"] = r.error.to_dict()
    if r.checkpoint is not None:
        out["checkpoint"] = dict(r.checkpoint)
    if r.undone_at is not None:
        out["undone_at"] = r.undone_at
    if r.warnings:
        out["warnings"] = [dict(w) for w in r.warnings]
    if new_conversation(r):
        # the turn did not continue the thread's conversation (docs/threads.md)
        out["new_conversation"] = True
    return out


def _check_id(thread_id: str, what: str = "thread id") -> str:
    return check_id(thread_id, what)  # the one id rule of the CLI and the server


class Threads:
    """The threads of a :class:`~corral.Runner`'s store: ``runner.threads``.

    Every operation works from any host sharing the store. Undo and fork change a
    thread's state only while none of its runs is active (:class:`ThreadBusy`)."""

    def __init__(self, runner: Runner) -> None:
        self._runner = runner

    @property
    def store(self) -> Store:
        return self._runner.store

    # ------------------------------------------------------------------ read

    async def list(self, *, limit: int = 100, scan: int = 2000) -> list[ThreadSummary]:
        """Threads with runs, newest activity first (at most ``limit``; the newest ``scan``
        runs are looked at). A forked thread appears once it has run a turn."""
        runs = await self.store.list_runs(limit=scan)
        by_thread: dict[str, list[RunRecord]] = {}
        for r in runs:
            by_thread.setdefault(r.thread_id, []).append(r)
        out: list[ThreadSummary] = []
        for thread_id, rs in by_thread.items():
            rs.sort(key=lambda r: r.started_at)
            last = rs[-1]
            active = next((r.run_id for r in rs if not r.terminal), None)
            out.append(ThreadSummary(
                thread_id, len(rs), last.status.value,
                max(r.finished_at or r.updated_at for r in rs), last.harness,
                await self._title(rs[0]), active))
        out.sort(key=lambda t: t.last_activity, reverse=True)
        return out[:limit]

    async def show(self, thread_id: str) -> ThreadDetail:
        """The thread's runs, checkpoints and saved sessions; :class:`UnknownThread` when
        it has none of them."""
        _check_id(thread_id)
        runs = await self.store.list_by_thread(thread_id)
        checkpoints = await self.store.list_checkpoints(thread_id)
        sessions = await self.store.list_sessions(thread_id)
        if not runs and not checkpoints and not sessions:
            raise UnknownThread(thread_id)
        titles = {r.run_id: await self._title(r) for r in runs}
        return ThreadDetail(thread_id, runs, checkpoints, sessions, titles)

    async def _title(self, record: RunRecord) -> str:
        argv = (record.spec or {}).get("argv")
        if isinstance(argv, list) and argv:
            return _cut(" ".join(str(a) for a in argv))
        with anyio.move_on_after(2):
            seen = 0
            async for logged in self.store.read(record.run_id, 0):
                event = logged.event
                if event.get("type") == "CUSTOM" and event.get("name") == _PROMPT_EVENT:
                    value = event.get("value")
                    if isinstance(value, dict) and isinstance(value.get("prompt"), str):
                        return _cut(value["prompt"])
                seen += 1
                if seen >= 5:
                    break
        return ""

    # ------------------------------------------------------------------ change

    async def _idle(self, thread_id: str) -> None:
        active = await self.store.find_active_run(thread_id)
        if active is not None:
            raise ThreadBusy(thread_id, active.run_id)
        await last_turn_recorded(self.store, thread_id)  # a turn that just ended

    async def _state_after(self, thread_id: str, run: RunRecord | None,
                           runs: Sequence[RunRecord]) -> Checkpoint:
        """The checkpoint holding the thread's state after ``run`` (``None``: before its
        first turn, i.e. its initial or fork checkpoint)."""
        own = {r.run_id for r in runs}
        infos = await self.store.list_checkpoints(thread_id)
        if run is not None:
            found = [c for c in infos if c.run_id == run.run_id]
            what = f"after run {run.run_id}"
            if not found and run.checkpoint and ("error" in run.checkpoint
                                                 or "skipped" in run.checkpoint):
                why = run.checkpoint.get("error") or run.checkpoint.get("skipped")
                what += f" (none was taken: {why})"
        else:
            found = [c for c in infos if c.run_id is None or c.run_id not in own]
            what = "before its first turn"
        if not found:
            raise ThreadError(f"thread {thread_id!r} has no checkpoint of its state {what}; "
                              "this cannot be undone or forked from")
        cp = await self.store.get_checkpoint(found[-1].checkpoint_id)
        if cp is None:  # removed meanwhile
            raise ThreadError(f"the checkpoint of thread {thread_id!r} {what} was removed")
        return cp

    async def undo(self, thread_id: str) -> ThreadDetail:
        """Put the workspace and the conversation back as they were before the thread's
        last turn (not undone yet); that run stays in the history with ``undone_at``.
        :class:`ThreadBusy` while a run of the thread is active."""
        _check_id(thread_id)
        await self._idle(thread_id)
        runs = await self.store.list_by_thread(thread_id)
        live = [r for r in runs if r.undone_at is None]
        if not live:
            if not runs:
                raise UnknownThread(thread_id)
            raise ThreadError(f"thread {thread_id!r} has no turn left to undo")
        last = live[-1]
        target = await self._state_after(thread_id, live[-2] if len(live) > 1 else None,
                                         runs)
        head = await copy_checkpoint(self.store, target, thread_id=thread_id,
                                     meta={"undo_of": last.run_id})
        await self._set_session(thread_id, head)
        await self._restore_sandbox(last, head)
        await self.store.update(last.run_id, RunPatch(undone_at=time.time()))
        return await self.show(thread_id)

    async def fork(self, thread_id: str, new_thread_id: str, *, at: str | None = None
                   ) -> ThreadDetail:
        """Start thread ``new_thread_id`` from ``thread_id``'s state after run ``at``
        (default: its current state): the workspace and the conversation, in a sandbox of
        its own (made when its first turn runs)."""
        _check_id(thread_id)
        _check_id(new_thread_id, "new thread id")
        if new_thread_id == thread_id:
            raise ThreadError("a fork needs a new thread id (--as), not the thread's own")
        if (await self.store.list_by_thread(new_thread_id)
                or await self.store.list_checkpoints(new_thread_id)
                or await self.store.list_sessions(new_thread_id)):
            raise ThreadError(f"thread {new_thread_id!r} exists already; choose another id")
        await last_turn_recorded(self.store, thread_id)  # a turn that just ended
        runs = await self.store.list_by_thread(thread_id)
        if at is None:
            infos = await self.store.list_checkpoints(thread_id)
            if not infos:
                if not runs:
                    raise UnknownThread(thread_id)
                raise ThreadError(f"thread {thread_id!r} has no checkpoint to fork from")
            source = await self.store.get_checkpoint(infos[-1].checkpoint_id)
            if source is None:
                raise ThreadError(f"the checkpoint of thread {thread_id!r} was removed")
        else:
            run = next((r for r in runs if r.run_id == at), None)
            if run is None:
                raise ThreadError(f"run {at!r} is not a run of thread {thread_id!r} "
                                  f"(corral threads show {thread_id} lists them)")
            source = await self._state_after(thread_id, run, runs)
        head = await copy_checkpoint(self.store, source, thread_id=new_thread_id,
                                     meta={"fork_of": thread_id, "at": source.run_id})
        await self._set_session(new_thread_id, head)
        return await self.show(new_thread_id)

    async def remove(self, thread_id: str, *, runs: bool = False) -> dict[str, int]:
        """Remove the thread's saved sessions, checkpoints and sandboxes, then collect the
        chunks no checkpoint names any more (those nobody put or touched for
        :data:`~corral.stores.CHUNK_GRACE`: a writer may be about to name a newer one; the
        next ``corral gc`` frees those). With ``runs``, its runs go too: their records,
        event logs and approval requests; without, they are kept. Returns how many of each
        were removed. :class:`ThreadBusy` while a run of the thread is active (a run
        started meanwhile is kept, and named)."""
        _check_id(thread_id)
        await self._idle(thread_id)
        records = await self.store.list_by_thread(thread_id)
        infos = await self.store.list_checkpoints(thread_id)
        sessions = await self.store.delete_sessions(thread_id)
        if not records and not infos and not sessions:
            raise UnknownThread(thread_id)
        for c in infos:
            await self.store.delete_checkpoint(c.checkpoint_id)
        sandboxes = 0
        for key in dict.fromkeys(r.sandbox_key for r in records if r.sandbox_key):
            if await self._destroy_sandbox(records[-1], key):
                sandboxes += 1
        removed = {"sessions": sessions, "checkpoints": len(infos), "sandboxes": sandboxes,
                   "runs": 0, "chunks": await self.store.collect_chunks()}
        if not runs:
            await forget_sessions(self.store, records)
        else:
            for r in records:
                try:
                    if await self.store.delete_run(r.run_id):
                        removed["runs"] += 1
                except RunActive:
                    raise ThreadBusy(thread_id, r.run_id) from None
                await _forget_journal(r)
        return removed

    # ------------------------------------------------------------------ helpers

    async def _set_session(self, thread_id: str, head: Checkpoint) -> None:
        """The thread's saved session becomes the one ``head`` holds (none: none)."""
        if head.session is None:
            await self.store.delete_sessions(thread_id)
            return
        session = await session_of(self.store, head.session, thread_id, head.run_id)
        await self.store.delete_sessions(thread_id)
        await self.store.put_session(session)

    def _provider_for(self, record: RunRecord) -> Callable[[str], Provider]:
        return self._runner._providers_of(record)

    async def _restore_sandbox(self, last: RunRecord, head: Checkpoint) -> None:
        """The thread's kept sandbox gets ``head``'s workspace; one this host cannot reach
        is forgotten, so the thread's next turn makes a fresh one from ``head``."""
        key = last.sandbox_key
        if key is None:
            return
        async with key_lock(self.store, key):
            instance = await self.store.get_instance(key)
            if instance is None:
                return
            handle = None
            try:
                handle = await self._provider_for(last)(instance.provider).resume(
                    instance.provider_sandbox_id)
            except CorralError as exc:
                log.warning("thread %s: its sandbox is unreachable: %s", last.thread_id, exc)
            if handle is not None:
                await restore_checkpoint(handle, self.store, head, session=False)
                # the session files of the undone turn stay in the home; the restore of
                # the saved session keeps files it finds, so clear the CLIs' directories
                await self._clear_sessions(handle, last)
                return
            await self.store.delete_instance(key)

    async def _clear_sessions(self, handle: Any, last: RunRecord) -> None:
        try:
            harness = harness_for_record(last)
        except CorralError:
            return
        for rel in getattr(harness, "session_dirs", ()):
            try:
                await handle.fs.remove(f"/home/agent/{rel}", recursive=True)
            except FileNotFoundError:
                pass

    async def _destroy_sandbox(self, last: RunRecord, key: str) -> bool:
        async with key_lock(self.store, key):
            instance = await self.store.get_instance(key)
            if instance is None:
                return False
            try:
                await self._provider_for(last)(instance.provider).destroy(
                    instance.provider_sandbox_id)
            except CorralError as exc:
                log.warning("thread %s: destroying its sandbox failed: %s",
                            last.thread_id, exc)
            await self.store.delete_instance(key)
            return True


async def _forget_journal(record: RunRecord) -> None:
    """Delete this host's journal of a deleted run (its id may be used again; a journal
    on another host is that host's prune's, once the run is unknown there too)."""
    try:
        paths, _nonce = locate_journal(record.journal, record.run_id)
    except JournalLocationError:
        return
    failed = await anyio.to_thread.run_sync(delete_journal, paths)
    if failed:
        log.warning("run %s: deleting its journal failed: %s", record.run_id, failed)


def _cut(text: str) -> str:
    one = " ".join(text.split())
    return one if len(one) <= TITLE_CHARS else one[:TITLE_CHARS - 1] + "…"
