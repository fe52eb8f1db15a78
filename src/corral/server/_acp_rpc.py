"""ACP's transport: newline-delimited JSON-RPC 2.0 over two line channels (this process's
stdin and stdout, kept for the protocol alone): requests to the editor and their answers,
notifications, and the error answers both sides use."""

from __future__ import annotations

import fcntl
import io
import json
import os
from collections.abc import Awaitable, Callable
from typing import Any, Final

import anyio
import anyio.to_thread

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "RESOURCE_NOT_FOUND",
    "ConnectionGone",
    "ReceiveLine",
    "Rpc",
    "RpcError",
    "SendLine",
    "stdio_lines",
]

# JSON-RPC error codes
PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
RESOURCE_NOT_FOUND: Final = -32002

MAX_LINE: Final = 64 << 20
"""Bytes of one message from the editor; a longer line is refused as not JSON."""

ReceiveLine = Callable[[], Awaitable[bytes]]
"""The next line from the peer; ``b""`` once it closed the connection."""
SendLine = Callable[[bytes], Awaitable[None]]


class RpcError(Exception):
    """A JSON-RPC error answer."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ConnectionGone(Exception):
    """The editor closed the connection."""


class Rpc:
    """Newline-delimited JSON-RPC 2.0 over two byte channels: our requests and their
    answers, notifications, and answers to the peer's requests."""

    def __init__(self, send_line: SendLine) -> None:
        self._send_line = send_line
        self._lock = anyio.Lock()
        self._next = 0
        self._waiting: dict[int, tuple[anyio.Event, list[Any]]] = {}
        self.closed = False

    async def send(self, message: dict[str, Any]) -> None:
        if self.closed:
            raise ConnectionGone()
        data = json.dumps({"jsonrpc": "2.0", **message}, separators=(",", ":")).encode()
        async with self._lock:
            await self._send_line(data + b"\n")

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        await self.send({"method": method, "params": params})

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        self._next += 1
        rid = self._next
        done = anyio.Event()
        slot: list[Any] = []
        self._waiting[rid] = (done, slot)
        try:
            await self.send({"id": rid, "method": method, "params": params})
            await done.wait()
        finally:
            self._waiting.pop(rid, None)
        if not slot:
            raise ConnectionGone()
        answer = slot[0]
        if "error" in answer:
            err = answer["error"] if isinstance(answer["error"], dict) else {}
            raise RpcError(int(err.get("code", INTERNAL_ERROR)), str(err.get("message", "")))
        return answer.get("result")

    def answered(self, message: dict[str, Any]) -> None:
        rid = message.get("id")
        waiting = self._waiting.get(rid) if isinstance(rid, int) else None
        if waiting is not None:
            waiting[1].append(message)
            waiting[0].set()

    def close(self) -> None:
        self.closed = True
        for done, _slot in self._waiting.values():
            done.set()


def stdio_lines() -> tuple[ReceiveLine, SendLine]:
    """This process's stdin and stdout as the protocol's line channels. The protocol gets
    private copies of fds 0 and 1; fd 1 then points at stderr (and fd 0 at ``/dev/null``),
    so nothing else this process or its children print can corrupt it."""
    wire_in = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    wire_out = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    reader = io.BufferedReader(io.FileIO(wire_in, "rb"), buffer_size=1 << 16)
    writer = io.FileIO(wire_out, "wb")

    async def receive_line() -> bytes:
        line: bytes = await anyio.to_thread.run_sync(reader.readline, MAX_LINE,
                                                     abandon_on_cancel=True)
        return line

    def write_all(data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[writer.write(view) or 0:]

    async def send_line(data: bytes) -> None:
        try:
            await anyio.to_thread.run_sync(write_all, data)
        except OSError:  # the editor is gone (EPIPE)
            raise ConnectionGone() from None

    return receive_line, send_line
