"""One store tail per run per process, fanned out in memory to every viewer of the run.

Two hundred browsers watching one run must not mean two hundred store queries per event:
a :class:`RunFeed` tails the run's log once (``store.read``) and keeps the newest events in
a window; each viewer walks that window from its own offset. A viewer that starts behind the
window (an old ``Last-Event-ID``) reads the store directly until it reaches the window, then
joins it. Log offsets are gap-free from 1, so the window is a list indexed by offset.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Final, Generic, TypeVar

import anyio
from anyio.abc import TaskGroup

from corral._log import library_logger
from corral.stores._protocols import EventLog, LoggedEvent

log = library_logger("corral.server._run_fanout")

DEFAULT_WINDOW: Final = 4096

_T = TypeVar("_T")
_Item = TypeVar("_Item", bytes, LoggedEvent)


@asynccontextmanager
async def closing(iterator: AsyncIterator[_T]) -> AsyncIterator[AsyncIterator[_T]]:
    """Close an async iterator (a store's ``read`` generator) however the block ends."""
    try:
        yield iterator
    finally:
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            await aclose()


@dataclass(eq=False)
class RunFeed:
    """The live tail of one run's log, shared by this process's viewers of the run."""

    run_id: str
    base: int
    """The window holds the events with offsets ``base + 1 .. last``."""
    encode: Callable[[LoggedEvent], bytes]
    window: int = DEFAULT_WINDOW
    frames: list[bytes] = field(default_factory=list)
    """Encoded events (``encode``), once per event however many viewers there are."""
    events: list[LoggedEvent] = field(default_factory=list)
    """The same events as read (for viewers that rewrite them: never decoded back)."""
    closed: bool = False
    error: BaseException | None = None
    viewers: int = 0
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    _changed: anyio.Event = field(default_factory=anyio.Event)

    @property
    def last(self) -> int:
        return self.base + len(self.frames)

    def after(self, position: int) -> list[bytes]:
        """Window frames of the events with offset > ``position`` (``position >= base``)."""
        return self.frames[position - self.base :]

    def events_after(self, position: int) -> list[LoggedEvent]:
        """Window events with offset > ``position`` (``position >= base``)."""
        return self.events[position - self.base :]

    def changed(self) -> anyio.Event:
        """An event set at the next append or at the end of the log."""
        return self._changed

    def _notify(self) -> None:
        event, self._changed = self._changed, anyio.Event()
        event.set()

    def _add(self, logged: LoggedEvent) -> None:
        if logged.offset != self.last + 1:  # never expected: offsets are gap-free
            raise RuntimeError(
                f"run {self.run_id}: log offset {logged.offset} after {self.last}"
            )
        self.frames.append(self.encode(logged))
        self.events.append(logged)
        if len(self.frames) >= 2 * self.window:
            drop = len(self.frames) - self.window
            del self.frames[:drop]
            del self.events[:drop]
            self.base += drop

    async def pump(self, store: EventLog) -> None:
        """Tail the store into the window until the log closes (or the feed is dropped)."""
        with self.scope:
            try:
                async with closing(store.read(self.run_id, self.last)) as events:
                    async for logged in events:
                        self._add(logged)
                        self._notify()
                self.closed = True
            except Exception as exc:  # noqa: BLE001 - handed to every viewer
                log.warning("tailing run %s failed: %s", self.run_id, exc)
                self.error = exc
            finally:
                self._notify()


class FeedHub:
    """The feeds of the runs this process's viewers watch (created and dropped on demand)."""

    def __init__(
        self,
        store: EventLog,
        task_group: TaskGroup,
        encode: Callable[[LoggedEvent], bytes],
        *,
        window: int = DEFAULT_WINDOW,
    ) -> None:
        self.store = store
        self.tg = task_group
        self.encode = encode
        self.window = window
        self.feeds: dict[str, RunFeed] = {}

    def acquire(self, run_id: str, after: int) -> RunFeed:
        feed = self.feeds.get(run_id)
        if feed is None or feed.error is not None:
            feed = RunFeed(run_id, base=max(0, after), encode=self.encode, window=self.window)
            self.feeds[run_id] = feed
            self.tg.start_soon(feed.pump, self.store)
        feed.viewers += 1
        return feed

    def release(self, feed: RunFeed) -> None:
        feed.viewers -= 1
        if feed.viewers <= 0:
            feed.scope.cancel()
            if self.feeds.get(feed.run_id) is feed:
                del self.feeds[feed.run_id]

    def wake_all(self) -> None:
        """Wake every waiting viewer now (they re-check ``stopping``)."""
        for feed in list(self.feeds.values()):
            feed._notify()

    def follow(
        self,
        run_id: str,
        after: int,
        *,
        idle: float,
        stopping: Callable[[], bool] = lambda: False,
    ) -> AsyncGenerator[list[bytes], None]:
        """The run's events after offset ``after``, encoded, in batches, until its log
        closes; an empty batch after each ``idle`` seconds without events (the cue for a
        heartbeat).

        Ends early when ``stopping()`` turns true (checked at every wake-up).
        """
        return self._follow(_Frames(self.encode), run_id, after, idle, stopping)

    def follow_events(
        self,
        run_id: str,
        after: int,
        *,
        idle: float,
        stopping: Callable[[], bool] = lambda: False,
    ) -> AsyncGenerator[list[LoggedEvent], None]:
        """:meth:`follow` for viewers that rewrite the events (the AG-UI endpoint): the
        events as read, not their frames."""
        return self._follow(_Events(), run_id, after, idle, stopping)

    async def _follow(
        self,
        view: _View[_Item],
        run_id: str,
        after: int,
        idle: float,
        stopping: Callable[[], bool],
    ) -> AsyncGenerator[list[_Item], None]:
        feed = self.acquire(run_id, after)
        position = max(0, after)
        try:
            while not stopping():
                if position < feed.base:
                    # Behind the window: read the store itself up to where the window starts.
                    async with closing(self.store.read(run_id, position)) as direct:
                        async for logged in direct:
                            position = logged.offset
                            yield [view.one(logged)]
                            if position >= feed.base:
                                break
                        else:
                            return  # the log closed
                    continue
                batch = view.window(feed, position)
                if batch:
                    position += len(batch)
                    yield batch
                    continue
                if feed.error is not None:
                    raise feed.error
                if feed.closed:
                    return
                changed = feed.changed()
                with anyio.move_on_after(idle) as waited:
                    await changed.wait()
                if waited.cancelled_caught:
                    yield []
        finally:
            self.release(feed)


class _View(Generic[_Item]):
    """What a viewer takes of each event: its frame or the event itself."""

    def one(self, logged: LoggedEvent) -> _Item:
        raise NotImplementedError

    def window(self, feed: RunFeed, position: int) -> list[_Item]:
        raise NotImplementedError


class _Frames(_View[bytes]):
    def __init__(self, encode: Callable[[LoggedEvent], bytes]) -> None:
        self.encode = encode

    def one(self, logged: LoggedEvent) -> bytes:
        return self.encode(logged)

    def window(self, feed: RunFeed, position: int) -> list[bytes]:
        return feed.after(position)


class _Events(_View[LoggedEvent]):
    def one(self, logged: LoggedEvent) -> LoggedEvent:
        return logged

    def window(self, feed: RunFeed, position: int) -> list[LoggedEvent]:
        return feed.events_after(position)
