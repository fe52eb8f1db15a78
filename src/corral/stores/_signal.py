"""Change signals that wake log tailers without busy-spinning.

:class:`LocalSignal` is a generation counter plus an anyio event for one process.
:class:`NotifySignal` adds cross-process wake-ups: every listening store binds a Linux
abstract-namespace datagram socket and drops a marker file named after it into a shared
directory next to the database; an appender sends one byte to every marker's socket after its
commit. Markers whose socket is gone (the process died) are removed by the next poke. A tailer
still re-checks the store every ``fallback`` seconds, so a lost datagram only delays it.

Abstract names have no file modes, and ``/proc/net/unix`` lists them to every user: the
kernel stamps every datagram with its sender's credentials (``SO_PASSCRED``), and only
those of this process's uid (the store's owner: its marker directory is private) or root
wake anyone. Another user's datagrams are drained and ignored.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import sys
import uuid
from pathlib import Path

import anyio

_PREFIX = "corral-"
_UCRED = struct.Struct("iII")  # pid, uid, gid
_CMSG_SPACE = socket.CMSG_SPACE(_UCRED.size)


class LocalSignal:
    """A generation counter; :meth:`wait` returns once it moves past ``seen`` (or times out)."""

    def __init__(self) -> None:
        self.generation = 0
        self._event: anyio.Event | None = None

    def notify(self) -> None:
        """Wake every waiter of this process (call from the event loop thread)."""
        self.generation += 1
        self._kick()

    def _kick(self) -> None:
        event, self._event = self._event, None
        if event is not None:
            event.set()

    def _waiter(self) -> anyio.Event:
        if self._event is None:
            self._event = anyio.Event()
        return self._event

    async def wait(self, seen: int, timeout: float) -> None:
        with anyio.move_on_after(timeout):
            while self.generation == seen:
                await self._waiter().wait()


class NotifySignal(LocalSignal):
    """A :class:`LocalSignal` that other processes can poke through ``directory``."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = directory
        self._name = uuid.uuid4().hex
        self._sock: socket.socket | None = None
        self._sender: socket.socket | None = None
        self._draining = False
        self.supported = sys.platform.startswith("linux")
        self.ignored = 0
        """Datagrams dropped because another user sent them."""
        self._trusted = {0, os.geteuid()}

    def listen(self) -> None:
        """Start receiving pokes (idempotent). Call before the first read of the store, so a
        poke that lands between that read and the wait is not missed."""
        if self._sock is not None or not self.supported:
            return
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # the sender's uid
        sock.bind("\0" + _PREFIX + self._name)
        (self.directory / self._name).touch()
        self._sock = sock

    def poke(self) -> None:
        """Wake tailers in this process and every other listening process."""
        self.notify()
        if not self.supported:
            return
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return
        if self._sender is None:
            self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sender.setblocking(False)
        for name in names:
            # Our own socket too: a task of ours may be blocked watching it.
            if len(name) != 32:
                continue
            try:
                self._sender.sendto(b"!", "\0" + _PREFIX + name)
            except ConnectionRefusedError:
                # Nobody is bound to that name any more: its process is gone.
                with contextlib.suppress(OSError):
                    (self.directory / name).unlink()
            except OSError:
                # Full buffer: the peer has pending pokes already and will wake anyway.
                pass

    @property
    def sock(self) -> socket.socket | None:
        """The listening socket, once :meth:`listen` ran."""
        return self._sock

    def _drain(self) -> bool:
        """Read every queued datagram; whether one came from a trusted sender."""
        assert self._sock is not None
        woken = False
        while True:
            try:
                _data, ancillary, _flags, _addr = self._sock.recvmsg(64, _CMSG_SPACE)
            except OSError:  # BlockingIOError: all read
                return woken
            if self._from_trusted(ancillary):
                woken = True
            else:
                self.ignored += 1

    def _from_trusted(self, ancillary: list[tuple[int, int, bytes]]) -> bool:
        for level, kind, data in ancillary:
            if (level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS
                    and len(data) >= _UCRED.size):
                _pid, uid, _gid = _UCRED.unpack_from(data)
                return uid in self._trusted
        return False  # no credentials: not a datagram we can vouch for

    async def wait(self, seen: int, timeout: float) -> None:
        if self._sock is None:
            await super().wait(seen, timeout)
            return
        with anyio.move_on_after(timeout):
            while self.generation == seen:
                if self._draining:
                    await self._waiter().wait()
                    continue
                # One task per process watches the socket; the others wait on the event.
                self._draining = True
                try:
                    await anyio.wait_readable(self._sock)
                    if self._drain():
                        self.generation += 1
                finally:
                    self._draining = False
                    self._kick()

    def close(self) -> None:
        """Stop listening and remove this store's marker."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            with contextlib.suppress(OSError):
                (self.directory / self._name).unlink()
        if self._sender is not None:
            self._sender.close()
            self._sender = None
