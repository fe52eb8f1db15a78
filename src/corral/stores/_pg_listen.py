"""Tail wake-ups for PostgreSQL stores: one LISTEN connection per process and database.

An append commits ``pg_notify('corral_events', '<schema>/<run id>')`` in its own transaction
(PostgreSQL delivers it at commit, so nobody is woken for an event they cannot read yet). A
:class:`Hub` is a daemon thread owning one autocommit connection that listens on that
channel, shared by every store of this process on the same database (200 readers hold one
connection, not 200). It hands each notification to the :class:`RunWakeups` of the stores
of that schema that have a reader of that run.

psycopg's async API is asyncio-only and corral runs on trio too, so the thread uses sync
psycopg and wakes the event loops through a socket pair per store (loop-agnostic:
``anyio.wait_readable``). When the connection drops (``pg_terminate_backend``, a restarted
server) the thread reconnects with backoff and, once listening again, wakes every reader of
every store: they re-read from their offsets, so nothing committed meanwhile is missed and
nothing is repeated. A reader also re-reads every few seconds regardless (the stores'
``fallback``), the last line of defence against a wake-up lost some other way.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading
from collections.abc import Iterator
from typing import Any, Final

import anyio
import psycopg

from corral._log import library_logger

log = library_logger("corral.stores._pg_listen")

CHANNEL: Final = "corral_events"
MAX_PAYLOAD: Final = 7999
"""PostgreSQL refuses a NOTIFY payload of 8000 bytes or more; a longer one wakes every reader
of the schema instead (see :func:`payload`)."""
LISTEN_NAME: Final = "corral-listen"
"""``application_name`` of the listening connections (how to find them in
``pg_stat_activity``)."""
_HEALTH_CHECK: Final = 15.0
"""Seconds of silence after which the thread pings the server, so a connection that died
without a word is noticed (with the TCP keepalives set on it)."""
_BACKOFF: Final = (0.05, 5.0)


def payload(schema: str, run_id: str) -> str:
    """The notification for a commit to ``run_id``: ``schema/run_id``, or ``schema/`` (every
    run of the schema) when the run id is too long for a payload."""
    text = f"{schema}/{run_id}"
    return text if len(text.encode()) <= MAX_PAYLOAD else f"{schema}/"


class RunWakeups:
    """One store's wake-ups: which runs its readers tail, and a generation per run.

    :meth:`poke` is called from the hub's thread; the rest runs on the store's event loop.
    One waiting task at a time watches the socket (trio lets one task wait on a descriptor),
    applies what the hub queued, and wakes the other waiters through an event.
    """

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self._lock = threading.Lock()
        self._watching: dict[str, int] = {}
        self._pending: set[str] = set()
        self._pending_all = False
        self._rsock, self._wsock = socket.socketpair()
        self._rsock.setblocking(False)
        self._wsock.setblocking(False)
        self._gens: dict[str, int] = {}
        self._all = 0
        self._event: anyio.Event | None = None
        self._draining = False
        self._closed = False

    # ------------------------------------------------------------------ any thread

    def poke(self, run_id: str | None) -> None:
        """Wake the readers of ``run_id`` (every reader when ``None``)."""
        with self._lock:
            if self._closed:
                return
            if run_id is None:
                self._pending_all = True
            elif run_id in self._watching:
                self._pending.add(run_id)
            else:
                return  # nobody here reads that run
            try:
                self._wsock.send(b"!")
            except OSError:
                pass  # buffer full: a wake-up is pending already

    # ------------------------------------------------------------------ event loop

    @contextlib.contextmanager
    def watch(self, run_id: str) -> Iterator[None]:
        """Register a reader of ``run_id`` for the duration (before its first query, so a
        commit between that query and the wait still wakes it)."""
        with self._lock:
            self._watching[run_id] = self._watching.get(run_id, 0) + 1
            self._gens.setdefault(run_id, 0)
        try:
            yield
        finally:
            with self._lock:
                left = self._watching[run_id] - 1
                if left:
                    self._watching[run_id] = left
                else:
                    del self._watching[run_id]
                    self._gens.pop(run_id, None)
                    self._pending.discard(run_id)

    def seen(self, run_id: str) -> int:
        """A number that grows whenever a reader of ``run_id`` should look again."""
        return self._all + self._gens.get(run_id, 0)

    def notified(self, run_id: str) -> int:
        """How many notifications naming ``run_id`` arrived while watched (wake-ups of
        everyone, after a reconnect, do not count)."""
        return self._gens.get(run_id, 0)

    def _apply(self) -> None:
        with contextlib.suppress(OSError):
            while self._rsock.recv(4096):
                pass
        with self._lock:
            pending, self._pending = self._pending, set()
            everyone, self._pending_all = self._pending_all, False
        if everyone:
            self._all += 1
        for run_id in pending:
            if run_id in self._gens:
                self._gens[run_id] += 1

    def _kick(self) -> None:
        event, self._event = self._event, None
        if event is not None:
            event.set()

    async def wait(self, run_id: str, seen: int, timeout: float) -> None:
        """Return once :meth:`seen` moved past ``seen`` for ``run_id``, or after ``timeout``
        (at once when closed: the reader's next query reports the closed store)."""
        with anyio.move_on_after(timeout):
            while self.seen(run_id) == seen and not self._closed:
                if self._draining:
                    if self._event is None:
                        self._event = anyio.Event()
                    await self._event.wait()
                    continue
                self._draining = True
                try:
                    try:
                        await anyio.wait_readable(self._rsock)
                    except (anyio.ClosedResourceError, OSError):
                        if not self._closed:
                            raise
                        return  # closed under us: the reader's next query says so
                    self._apply()
                finally:
                    self._draining = False
                    self._kick()

    def close(self) -> None:
        """Stop taking wake-ups; a task parked on the socket gets an error, not a hang."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._draining:
            anyio.notify_closing(self._rsock)
        self._rsock.close()
        self._wsock.close()
        self._kick()


class Hub:
    """The listening thread of one database, shared by every subscribed store."""

    def __init__(self, dsn: str) -> None:
        self.key = dsn
        self._dsn = dsn
        self._subs: set[RunWakeups] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.listening = threading.Event()
        """Set while the connection is LISTENing (for tests and health checks)."""
        self.allow_connect = threading.Event()
        """Cleared, the thread does not (re)connect until it is set again (a test seam: it
        holds a dropped connection down while events are appended)."""
        self.allow_connect.set()
        self.connects = 0
        """How many times a connection started listening."""
        self.backend_pid: int | None = None
        self.last_error: str | None = None
        self.thread = threading.Thread(target=self._run, name="corral-pg-listen", daemon=True)

    # ------------------------------------------------------------------ subscribers

    def add(self, wakeups: RunWakeups) -> None:
        with self._lock:
            self._subs.add(wakeups)

    def remove(self, wakeups: RunWakeups) -> int:
        with self._lock:
            self._subs.discard(wakeups)
            return len(self._subs)

    def _subscribers(self) -> list[RunWakeups]:
        with self._lock:
            return list(self._subs)

    def _dispatch(self, text: str) -> None:
        schema, sep, run_id = text.partition("/")
        if not sep:
            return
        for sub in self._subscribers():
            if sub.schema == schema:
                sub.poke(run_id or None)

    def _wake_everyone(self) -> None:
        for sub in self._subscribers():
            sub.poke(None)

    # ------------------------------------------------------------------ thread

    def stop(self) -> None:
        self._stop.set()
        self.allow_connect.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"!")

    def _sleep(self, seconds: float) -> None:
        self._stop.wait(seconds)

    def _run(self) -> None:
        delay = _BACKOFF[0]
        try:
            while not self._stop.is_set():
                self.allow_connect.wait()
                if self._stop.is_set():
                    break
                try:
                    self._session(psycopg)
                    delay = _BACKOFF[0]  # it listened: the next outage starts afresh
                except psycopg.Error as exc:
                    self._failed(str(exc).strip().splitlines()[0] if str(exc).strip()
                                 else type(exc).__name__)
                except Exception:  # a bug must not end the tails' wake-ups for good
                    log.exception("PostgreSQL LISTEN thread failed; restarting it")
                    self._failed("internal error")
                if not self._stop.is_set():
                    self._sleep(delay)
                    delay = min(delay * 2, _BACKOFF[1])
        finally:
            self._wake_r.close()
            self._wake_w.close()

    def _failed(self, reason: str) -> None:
        if self.last_error is None:  # once per outage, not once per attempt
            log.warning("the LISTEN connection to PostgreSQL is down (%s); reconnecting, "
                        "tails re-read every few seconds meanwhile", reason)
        self.last_error = reason

    def _session(self, psycopg: Any) -> None:
        """Connect, LISTEN, wake everyone, dispatch until the connection fails or stop."""
        conn = psycopg.connect(self._dsn, autocommit=True)
        try:
            conn.execute(f"LISTEN {CHANNEL}")
            self.backend_pid = conn.info.backend_pid
            self.connects += 1
            if self.last_error is not None:
                log.info("the LISTEN connection to PostgreSQL is back")
            self.last_error = None
            self.listening.set()
            # Commits made while nobody listened sent nobody a notification.
            self._wake_everyone()
            self._listen(conn)
        finally:
            self.listening.clear()
            with contextlib.suppress(Exception):
                conn.close()

    def _listen(self, conn: Any) -> None:
        fd = conn.fileno()
        while not self._stop.is_set():
            ready, _w, _x = select.select([fd, self._wake_r], [], [], _HEALTH_CHECK)
            if self._wake_r in ready:
                with contextlib.suppress(OSError):
                    self._wake_r.recv(64)
                continue
            if not ready:
                conn.execute("SELECT 1")  # raises if the connection died silently
            # timeout=0: take what arrived (or was kept while the ping ran), never block
            for note in conn.notifies(timeout=0):
                if note.channel == CHANNEL:
                    self._dispatch(note.payload)


_HUBS: dict[str, Hub] = {}
_HUBS_LOCK = threading.Lock()


def _forget_hubs() -> None:
    # A forked child has none of its parent's threads: it starts its own hubs.
    global _HUBS_LOCK
    _HUBS.clear()
    _HUBS_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_hubs)


def subscribe(dsn: str, wakeups: RunWakeups) -> Hub:
    """Attach ``wakeups`` to the hub of this database (starting it if it is the first)."""
    with _HUBS_LOCK:
        hub = _HUBS.get(dsn)
        if hub is None:
            hub = _HUBS[dsn] = Hub(dsn)
            hub.add(wakeups)
            hub.thread.start()
        else:
            hub.add(wakeups)
    return hub


def unsubscribe(hub: Hub, wakeups: RunWakeups) -> threading.Thread | None:
    """Detach ``wakeups``; the last one out stops the hub and gets its thread to join."""
    with _HUBS_LOCK:
        if hub.remove(wakeups):
            return None
        if _HUBS.get(hub.key) is hub:
            del _HUBS[hub.key]
    hub.stop()
    return hub.thread


def hubs() -> list[Hub]:
    """The hubs of this process (for tests and diagnostics)."""
    with _HUBS_LOCK:
        return list(_HUBS.values())
