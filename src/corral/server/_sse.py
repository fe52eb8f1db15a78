"""Server-sent events: one run's log as an ``text/event-stream``.

Each event is ``id: <log offset>`` and ``data: <the AG-UI event as JSON>``; a client resumes
by sending the last id it saw (``Last-Event-ID``, which browsers' EventSource does by itself
on reconnect, or ``?after=``). Idle streams carry a comment line every heartbeat so proxies
and clients keep them open. When the run's log is closed the stream sends the comment
``: end`` and ends. It is a comment, not an event: AG-UI clients (``@ag-ui/client``) take
every frame with data for an AG-UI event and fail on one without a ``type``, while any SSE
parser skips comments; it carries no id, so the resume point stays the last real event.
Reconnecting after the end gets ``204 No Content``, which tells EventSource to stop.

The response is a plain ASGI callable rather than a generator handed to a framework, so the
viewer bookkeeping in its ``finally`` runs exactly once, however the client leaves.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final

import anyio
from starlette.types import Receive, Scope, Send

from corral._log import library_logger
from corral.stores._protocols import LoggedEvent
from corral.server._run_fanout import closing
from corral.server._service import RunService

log = library_logger("corral.server._sse")

RETRY_MS: Final = 1000
HEADERS: Final = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-store"),
    (b"x-accel-buffering", b"no"),
]
END_FRAME: Final = b": end\n\n"
HEARTBEAT_FRAME: Final = b": keep-alive\n\n"


def encode_event(logged: LoggedEvent) -> bytes:
    """One SSE frame. JSON never contains a raw newline, so ``data:`` is one line."""
    data = json.dumps(logged.event, ensure_ascii=False, separators=(",", ":"))
    return f"id: {logged.offset}\ndata: {data}\n\n".encode()


class EventStream:
    """The ASGI response streaming ``run_id``'s log after offset ``after``."""

    def __init__(self, service: RunService, run_id: str, after: int,
                 project: Callable[[list[LoggedEvent]], tuple[list[bytes], bool]] | None = None
                 ) -> None:
        self.service = service
        self.run_id = run_id
        self.after = after
        self.project = project
        """Renders each batch of events as frames (the AG-UI endpoint's view of the log);
        its ``True`` ends the stream."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        service = self.service
        await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
        async with anyio.create_task_group() as tg:

            async def watch_disconnect() -> None:
                while True:
                    message: dict[str, Any] = dict(await receive())
                    if message.get("type") == "http.disconnect":
                        tg.cancel_scope.cancel()
                        return

            tg.start_soon(watch_disconnect)
            arrived = False
            try:
                await service.viewer_arrived(self.run_id)
                arrived = True
                await _body(send, f"retry: {RETRY_MS}\n\n".encode())
                if self.project is None:
                    await self._plain(send)
                else:
                    await self._projected(send, self.project)
                if not service.closing.is_set():
                    await _body(send, END_FRAME)
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            except OSError as exc:
                log.debug("event stream of run %s ended: %s", self.run_id, exc)
            except Exception as exc:  # noqa: BLE001 - the client reconnects and resumes
                log.warning("event stream of run %s failed: %s", self.run_id, exc)
            finally:
                if arrived:
                    with anyio.CancelScope(shield=True):
                        await service.viewer_left(self.run_id)
                tg.cancel_scope.cancel()


    async def _plain(self, send: Send) -> None:
        service = self.service
        frames = service.hub.follow(self.run_id, self.after, idle=service.config.heartbeat,
                                    stopping=service.closing.is_set)
        async with closing(frames):
            async for batch in frames:
                await _body(send, b"".join(batch) if batch else HEARTBEAT_FRAME)

    async def _projected(self, send: Send,
                         project: Callable[[list[LoggedEvent]], tuple[list[bytes], bool]]
                         ) -> None:
        service = self.service
        events = service.hub.follow_events(self.run_id, self.after,
                                           idle=service.config.heartbeat,
                                           stopping=service.closing.is_set)
        async with closing(events):
            async for batch in events:
                if not batch:
                    await _body(send, HEARTBEAT_FRAME)
                    continue
                frames, done = project(batch)
                if frames:
                    await _body(send, b"".join(frames))
                if done:
                    return


async def _body(send: Send, chunk: bytes) -> None:
    await send({"type": "http.response.body", "body": chunk, "more_body": True})
