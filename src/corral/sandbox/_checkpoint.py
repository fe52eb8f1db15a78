"""Checkpoints of a sandbox's workspace into a store, and restores from one (#27).

:func:`checkpoint_workspace` streams the workspace (and, when asked, the agent's saved
session directory) out of the sandbox in **one** exec of the stdlib script
``corral/_insandbox/checkpoint.py`` run with the sandbox's Python: it lists every entry and
sends the content of the files that changed since the parent checkpoint (size, mtime and
stamp — device, inode, change time — compared in the sandbox), so a checkpoint after a
one-file edit reads that one file. Content is cut into 1 MiB chunks named by their SHA-256;
the store keeps each digest once, whichever checkpoint or thread put it first (chunks are
zlib-compressed when that saves a tenth or more).

Secrets never enter a checkpoint: every file read is scanned (the leak scan's matcher:
each secret value and its common encodings) before any of its chunks is stored, with the
last chunk held back until the next one is scanned so a value across two chunks is found
too. A file that holds a secret is **left out** — recorded in the manifest with
``skipped="secret"`` and no content, and logged with its path and the secret's name — rather
than redacted (a redacted file is a corrupted file that a restore would silently bring
back) or failing the whole checkpoint (one ``.env`` would stop every checkpoint of the
thread). Entries whose path or symlink target holds a secret are left out entirely. The
manifest records a salted fingerprint of the secret values checked against (never the
values): a child checkpoint reuses its parent's unchanged files only when the fingerprint
matches, else it reads and scans everything again.

A size cap (``max_bytes``, the sum of the files' sizes, checked from the listing before any
content is sent, and again against what arrives) raises :class:`CheckpointTooLarge` or,
with ``on_too_large="skip"``, logs a warning and returns ``None``; nothing is stored.

:func:`restore_checkpoint` streams the manifest and the chunks into the same script, which
empties the workspace and rebuilds it without following any symlink (see the script). The
manifest is checked before (every path under the root, every parent a directory of the
manifest): a hostile manifest is refused with :class:`~corral.stores.CorruptCheckpoint`.

A provider's native snapshot may serve as the fast local copy; the store copy is what any
host can restore. Wiring (a checkpoint when a thread's run ends, undo, fork, continuation)
is the caller's: these two functions are the whole API.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import posixpath
import secrets as _secrets
import signal
import struct
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import anyio
import anyio.from_thread
import anyio.to_thread
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from corral._errors import CorralError
from corral._insandbox import checkpoint as checkpoint_script
from corral.sandbox._checkpoint_host import Buffered, host_save
from corral.sandbox._contracts import Described, Handle, HostPaths, Process
from corral.sandbox._leakscan import _pattern
from corral.sandbox._redact import Redactor
from corral.stores._checkpoints import (
    Checkpoint,
    CheckpointEntry,
    CorruptCheckpoint,
    MissingChunks,
    SessionPart,
    UnknownCheckpoint,
    check_entries,
)
from corral.stores._protocols import CheckpointStore

__all__ = [
    "CHUNK_BYTES",
    "CheckpointError",
    "CheckpointTooLarge",
    "DEFAULT_MAX_BYTES",
    "SessionSource",
    "checkpoint_workspace",
    "restore_checkpoint",
]

log = logging.getLogger("corral.sandbox.checkpoint")

CHUNK_BYTES: Final = 1 << 20
DEFAULT_MAX_BYTES: Final = 1 << 30
"""The default size cap of a checkpoint: 1 GiB of file content."""
SANDBOX_PYTHON: Final = "/usr/bin/python3"
_BATCH_BYTES: Final = 8 << 20
"""Chunk bytes sent to the store per ``put_chunks``."""
_HEAD: Final = struct.Struct(">cI")
_MAX_HEADER: Final = 256 << 20
_ENCODED_RAW: Final = b"\x00"
_ENCODED_ZLIB: Final = b"\x01"

Secrets = Redactor | Mapping[str, str] | Iterable[tuple[str, str]]


class CheckpointError(CorralError):
    """A checkpoint or restore could not be made (the message says why)."""


class CheckpointTooLarge(CheckpointError):
    """The workspace is over the checkpoint size cap; nothing was stored."""

    def __init__(self, total: int, cap: int) -> None:
        super().__init__(
            f"the workspace holds {_size(total)}, over the checkpoint size cap of "
            f"{_size(cap)}; nothing was stored. Raise the cap, remove large "
            "files from the workspace, or choose to skip checkpoints that are too large")
        self.total = total
        self.cap = cap


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n} bytes"


@dataclass(frozen=True, slots=True)
class SessionSource:
    """Where the agent's saved session lives in the sandbox, for a checkpoint to carry it:
    ``root`` an absolute directory or ``~/…`` (the sandbox user's home)."""

    harness: str
    session_id: str
    root: str


def _script() -> str:
    return Path(checkpoint_script.__file__).read_text()


def _secret_items(secrets: Secrets) -> list[tuple[str, str]]:
    if isinstance(secrets, Redactor):
        return secrets.items()
    if isinstance(secrets, Mapping):
        return [(str(k), str(v)) for k, v in secrets.items()]
    return [(str(k), str(v)) for k, v in secrets]


def _fingerprint(items: list[tuple[str, str]], salt: bytes) -> str:
    """``salt:HMAC-SHA256(salt, sorted values)``: equal for equal secret sets, the values
    not recoverable from it (but by guessing: keep secrets high in entropy)."""
    mac = hmac.new(salt, b"\0".join(sorted(v.encode() for _n, v in items)), hashlib.sha256)
    return f"{salt.hex()}:{mac.hexdigest()}"


def _same_secrets(scan: str, items: list[tuple[str, str]]) -> bool:
    salt_hex, _, _ = scan.partition(":")
    try:
        salt = bytes.fromhex(salt_hex)
    except ValueError:
        return False
    return bool(salt) and hmac.compare_digest(_fingerprint(items, salt), scan)


def _encode(raw: bytes) -> bytes:
    # zlib spends ~70 ms per MiB on bytes that do not compress (binaries, archives): a
    # 4 KiB sample decides first
    sample = raw[:4096]
    if len(zlib.compress(sample, 1)) * 10 >= len(sample) * 9:
        return _ENCODED_RAW + raw
    packed = zlib.compress(raw, 1)
    if len(packed) * 10 < len(raw) * 9:
        return _ENCODED_ZLIB + packed
    return _ENCODED_RAW + raw


def _decode(digest: str, stored: bytes) -> bytes:
    try:
        if stored[:1] == _ENCODED_ZLIB:
            raw = zlib.decompress(stored[1:])
        elif stored[:1] == _ENCODED_RAW:
            raw = stored[1:]
        else:
            raise ValueError("unknown encoding")
    except (zlib.error, ValueError) as exc:
        raise CorruptCheckpoint(f"chunk {digest} in the store is unreadable: {exc}") from None
    if hashlib.sha256(raw).hexdigest() != digest:
        raise CorruptCheckpoint(f"chunk {digest} in the store does not match its digest")
    return raw


class _Frames:
    """Frames read from the script's stdout (untrusted: sizes are checked)."""

    def __init__(self, stream: AsyncIterator[bytes]) -> None:
        self._stream = stream
        self._buf = bytearray()
        self._pos = 0

    async def _fill(self, n: int) -> None:
        while len(self._buf) - self._pos < n:
            if self._pos:
                del self._buf[:self._pos]
                self._pos = 0
            try:
                self._buf += await self._stream.__anext__()
            except StopAsyncIteration:
                raise CheckpointError("the sandbox's checkpoint output ended early") from None

    async def next(self, limit: int) -> tuple[bytes, bytes]:
        await self._fill(_HEAD.size)
        kind, length = _HEAD.unpack_from(self._buf, self._pos)
        if length > limit:
            raise CheckpointError(f"the sandbox sent a frame of {length} bytes (limit {limit})")
        self._pos += _HEAD.size
        await self._fill(length)
        with memoryview(self._buf) as view:
            data = bytes(view[self._pos:self._pos + length])
        self._pos += length
        return kind, data


@dataclass
class _Uploader:
    """Chunks waiting for the store, put in batches (only those it lacks). A full batch is
    put by a task in ``tg`` while the stream goes on (one batch in flight at a time), so
    the sandbox keeps reading while the store writes; the task's error is raised by the
    next :meth:`add` or :meth:`flush` (never through the task group)."""

    store: CheckpointStore
    now: float | None
    tg: Any = None
    pending: dict[str, bytes] = field(default_factory=dict)
    size: int = 0
    sent: int = 0
    _busy: anyio.Event | None = None
    _error: BaseException | None = None

    async def add(self, digest: str, raw: bytes) -> None:
        if digest in self.pending:
            return
        self.pending[digest] = raw
        self.size += len(raw)
        if self.size >= _BATCH_BYTES:
            await self._wait()
            batch, self.pending, self.size = self.pending, {}, 0
            if self.tg is None:
                await self._put(batch)
            else:
                self._busy = anyio.Event()
                self.tg.start_soon(self._background, batch, self._busy)

    async def _wait(self) -> None:
        if self._busy is not None:
            await self._busy.wait()
            self._busy = None
        if self._error is not None:
            raise self._error

    async def _background(self, batch: dict[str, bytes], done: anyio.Event) -> None:
        try:
            await self._put(batch)
        except Exception as exc:  # raised in the stream's task by the next add/flush
            self._error = exc
        finally:
            done.set()

    async def _put(self, batch: dict[str, bytes]) -> None:
        missing = await self.store.missing_chunks(list(batch), now=self.now)
        if missing:
            encoded = await anyio.to_thread.run_sync(
                lambda: {d: _encode(batch[d]) for d in missing})
            await self.store.put_chunks(encoded, now=self.now)
            self.sent += sum(len(v) for v in encoded.values())

    async def flush(self) -> None:
        await self._wait()
        if self.pending:
            batch, self.pending, self.size = self.pending, {}, 0
            await self._put(batch)


@dataclass
class _Scanner:
    """One file's chunks, scanned for secrets before any of them may be stored; the last
    chunk is held back until the next one is scanned (a value across the boundary)."""

    pattern: Any
    table: dict[bytes, str]
    longest: int
    held: list[tuple[str, bytes]] = field(default_factory=list)
    carry: bytes = b""
    found: str | None = None

    def feed(self, data: bytes) -> None:
        if self.pattern is None or self.found is not None:
            return
        buf = self.carry + data
        m = self.pattern.search(buf)
        if m is not None:
            self.found = self.table[m.group(0)]
        self.carry = buf[-(self.longest - 1):] if self.longest > 1 else b""


async def _spawn(handle: Handle, python: str, cwd: str | None) -> Process:
    return await handle.process.spawn([python, "-I", "-S", "-c", _script()], cwd=cwd)


async def _release(proc: Process) -> None:
    """Close the process's pipes (a provider's process may have no ``aclose``)."""
    aclose = getattr(proc, "aclose", None)
    if aclose is not None:
        with anyio.CancelScope(shield=True):
            await aclose()


async def _stderr_of(proc: Process, into: list[bytes]) -> None:
    async for part in proc.stderr:
        if sum(map(len, into)) < 4096:
            into.append(part)


async def _finish(proc: Process, err: list[bytes], what: str) -> None:
    result = await proc.wait()
    await _stderr_of(proc, err)
    if not result.ok:
        tail = b"".join(err)[-500:].decode("utf-8", "replace").strip()
        raise CheckpointError(f"{what} in the sandbox failed ({result.describe()})"
                              + (f": {tail}" if tail else ""))


class _SandboxSource:
    """The save request answered by the script in the sandbox (one exec)."""

    def __init__(self, proc: Process) -> None:
        self.proc = proc
        self.stdout: AsyncIterator[bytes] = proc.stdout
        self.err: list[bytes] = []

    async def kill(self) -> None:
        await self.proc.kill(signal.SIGKILL)

    async def finish(self) -> None:
        await _finish(self.proc, self.err, "reading the workspace")


@asynccontextmanager
async def _sandbox_source(handle: Handle, python: str, request: bytes
                          ) -> AsyncIterator[_SandboxSource]:
    proc = await _spawn(handle, python, handle.workdir)
    try:
        await proc.write_stdin(request)
        await proc.close_stdin()
        yield _SandboxSource(proc)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await proc.kill(signal.SIGKILL)
        raise
    finally:
        await _release(proc)


class _HostSource:
    """The save request answered on the host (:func:`host_save`, in a worker thread),
    its frames handed over about 1 MiB at a time through a bounded stream."""

    def __init__(self, receive: MemoryObjectReceiveStream[bytes]) -> None:
        self.stdout: AsyncIterator[bytes] = receive
        self._receive = receive
        self._done = anyio.Event()
        self._error: BaseException | None = None

    async def produce(self, send: MemoryObjectSendStream[bytes], request: bytes,
                      root: str) -> None:
        def run() -> None:
            out = Buffered(lambda data: anyio.from_thread.run(send.send, data), CHUNK_BYTES)
            host_save(request, out, root)
            out.close()

        try:
            async with send:
                await anyio.to_thread.run_sync(run)
        except Exception as exc:  # raised by finish (a reader stopped early sees no end)
            self._error = exc
        finally:
            self._done.set()

    async def kill(self) -> None:
        await self._receive.aclose()  # the producer's next hand-over fails: it stops

    async def finish(self) -> None:
        await self._done.wait()
        if self._error is not None:
            raise CheckpointError(f"reading the workspace from the host failed: "
                                  f"{self._error}") from self._error


@asynccontextmanager
async def _host_source(request: bytes, root: str) -> AsyncIterator[_HostSource]:
    send, receive = anyio.create_memory_object_stream[bytes](4)
    source = _HostSource(receive)
    failed: Exception | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(source.produce, send, request, root)
        try:
            yield source
        except Exception as exc:  # raised after the group (not as an exception group)
            failed = exc
        finally:
            await receive.aclose()
    if failed is not None:
        raise failed


def _host_workspace(handle: Handle) -> str | None:
    """The host directory of ``handle``'s workspace, when a checkpoint may read it there:
    the provider keeps it in a host directory (:class:`HostPaths`) and binds nothing
    under it (what the sandbox sees there is then exactly that directory)."""
    if not isinstance(handle, HostPaths):
        return None
    workdir = posixpath.normpath(handle.workdir)
    binds = handle.binds if isinstance(handle, Described) else ()
    for _host, inside in binds:
        inside = posixpath.normpath(inside)
        if inside == workdir or inside.startswith(workdir.rstrip("/") + "/") \
                or workdir.startswith(inside.rstrip("/") + "/"):
            return None
    return handle.host_path(workdir)


def _known(parent: Checkpoint | None, same_secrets: bool,
           entries: tuple[CheckpointEntry, ...]) -> dict[str, CheckpointEntry]:
    """The parent's files the sandbox may skip when unchanged (none when the secrets
    changed: everything is read and scanned again)."""
    if parent is None or not same_secrets:
        return {}
    return {e.path: e for e in entries if e.kind == "file" and e.stamp
            and "\0" not in e.stamp}


def _save_request(roots: list[str], reuse: list[dict[str, CheckpointEntry]]) -> bytes:
    """The in-sandbox script's save request (NUL-separated fields: see the script)."""
    out = [b"S", str(CHUNK_BYTES).encode(), str(len(roots)).encode()]
    for root, known in zip(roots, reuse, strict=True):
        if "\0" in root:
            raise CheckpointError(f"the checkpoint root {root!r} holds a NUL byte")
        out += [root.encode("utf-8", "surrogateescape"), str(len(known)).encode()]
        for path, e in known.items():
            out += [path.encode("utf-8", "surrogateescape"),
                    f"{e.size}:{e.mtime_ns}:{e.stamp}".encode("utf-8", "surrogateescape")]
    return b"\0".join(out)


async def checkpoint_workspace(
    handle: Handle,
    store: CheckpointStore,
    *,
    thread_id: str,
    run_id: str | None = None,
    secrets: Secrets = (),
    max_bytes: int | None = DEFAULT_MAX_BYTES,
    on_too_large: Literal["error", "skip"] = "error",
    parent: Checkpoint | str | None = None,
    session: SessionSource | None = None,
    checkpoint_id: str | None = None,
    python: str = SANDBOX_PYTHON,
    now: float | None = None,
    session_part: SessionPart | None = None,
    meta: Mapping[str, Any] | None = None,
    host_read: bool = True,
) -> Checkpoint | None:
    """Checkpoint ``handle``'s workspace (its workdir) into ``store`` for ``thread_id``.

    ``parent`` (a checkpoint or its id) is the thread's previous checkpoint: its unchanged
    files are not read again. ``secrets`` are the run's secrets (name → value, or a
    :class:`~corral.Redactor`): a file holding one is left out (see the module docstring).
    Over ``max_bytes`` of content: :class:`CheckpointTooLarge`, or ``None`` and a warning
    with ``on_too_large="skip"``. ``session_part`` (instead of ``session``): a saved
    session already in the store's chunks (:func:`corral.sandbox._threads.session_part`),
    carried as is; ``meta`` is merged into the checkpoint's ``meta``. ``host_read``: where
    the provider keeps the workspace in a host directory (bubblewrap, local) and mounts
    nothing else under it, read it from the host (:mod:`corral.sandbox._checkpoint_host`)
    rather than by a command in the sandbox. Returns the stored
    :class:`~corral.stores.Checkpoint`."""
    if on_too_large not in ("error", "skip"):
        raise CheckpointError(f"on_too_large must be 'error' or 'skip', got {on_too_large!r}")
    if isinstance(parent, str):
        found = await store.get_checkpoint(parent)
        if found is None:
            raise CheckpointError(f"the parent checkpoint {parent!r} is not in the store")
        parent = found
    try:
        return await _checkpoint(handle, store, thread_id, run_id, _secret_items(secrets),
                                 max_bytes, on_too_large, parent, session, checkpoint_id,
                                 python, now, session_part, meta, host_read)
    except MissingChunks:
        # A chunk the parent named was collected underneath us (its manifest deleted
        # meanwhile): take the checkpoint again reading everything.
        if parent is None:
            raise
        return await _checkpoint(handle, store, thread_id, run_id, _secret_items(secrets),
                                 max_bytes, on_too_large, None, session, checkpoint_id,
                                 python, now, session_part, meta, host_read)


async def _checkpoint(
    handle: Handle, store: CheckpointStore, thread_id: str, run_id: str | None,
    items: list[tuple[str, str]], max_bytes: int | None, on_too_large: str,
    parent: Checkpoint | None, session: SessionSource | None, checkpoint_id: str | None,
    python: str, now: float | None, attached: SessionPart | None = None,
    meta: Mapping[str, Any] | None = None, host_read: bool = True,
) -> Checkpoint | None:
    same = parent is not None and _same_secrets(parent.scan, items)
    reuse_ws = _known(parent, same, parent.entries if parent else ())
    parent_session = parent.session if parent is not None else None
    reuse_s = {} if session is None or parent_session is None or \
        parent_session.root != session.root else _known(parent, same, parent_session.entries)
    roots = ["."] + ([session.root] if session is not None else [])
    request = _save_request(roots, [reuse_ws, reuse_s][:len(roots)])
    pattern, table, longest = _pattern(items)
    uploader = _Uploader(store, now)
    listings: list[Any] = []
    content: dict[tuple[int, str], tuple[int, tuple[str, ...], str | None]] = {}
    host_root = _host_workspace(handle) if session is None and host_read else None
    failed: Exception | None = None
    complete = False
    async with (_host_source(request, host_root) if host_root is not None
                else _sandbox_source(handle, python, request)) as proc:
        try:
            async def stream() -> bool:
                nonlocal listings
                frames = _Frames(proc.stdout)
                kind, head = await frames.next(_MAX_HEADER)
                if kind != b"H":
                    raise CheckpointError("the sandbox's checkpoint output has no listing")
                try:
                    listings = json.loads(head)["roots"]
                    if not isinstance(listings, list) or len(listings) != len(roots):
                        raise ValueError("wrong number of roots")
                except (ValueError, KeyError, TypeError) as exc:
                    raise CheckpointError(f"the sandbox's checkpoint listing is malformed: {exc}"
                                          ) from None
                total = sum(int(e[3]) for r in listings for e in r.get("entries", ())
                            if e[1] == "file")
                if max_bytes is not None and total > max_bytes:
                    await proc.kill()
                    _too_large(total, max_bytes, on_too_large)
                    return False
                received = 0
                for index, listing in enumerate(listings):
                    named = _named_secrets(listing, pattern)
                    for e in listing.get("entries", ()):
                        if not e[7]:
                            continue
                        scanner = _Scanner(pattern, table, longest)
                        if e[0] in named:  # left out of the manifest: its content is not kept
                            scanner.found = "-"
                        digests: list[str] = []
                        size = 0
                        skipped: str | None = None
                        while True:
                            kind, data = await frames.next(CHUNK_BYTES)
                            if kind == b"D":
                                size += len(data)
                                received += len(data)
                                if max_bytes is not None and received > max_bytes:
                                    await proc.kill()
                                    _too_large(received, max_bytes, on_too_large)
                                    return False
                                scanner.feed(data)
                                if scanner.found is None:
                                    digest = hashlib.sha256(data).hexdigest()
                                    digests.append(digest)
                                    scanner.held.append((digest, data))
                                    if len(scanner.held) > 1:
                                        await uploader.add(*scanner.held.pop(0))
                            elif kind == b"E":
                                break
                            elif kind == b"X":
                                skipped = "unreadable"
                                log.warning("checkpoint of thread %s: %s left out, unreadable "
                                            "in the sandbox (%s)", thread_id, e[0],
                                            data[:200].decode("utf-8", "replace"))
                                break
                            else:
                                raise CheckpointError(f"unexpected frame {kind!r} from the sandbox")
                        if scanner.found == "-":
                            continue
                        if scanner.found is not None:
                            skipped = "secret"
                            log.warning("checkpoint of thread %s: %s left out, it holds the "
                                        "value of secret %s", thread_id, e[0], scanner.found)
                        if skipped is None:
                            for held in scanner.held:
                                await uploader.add(*held)
                            content[(index, e[0])] = (size, tuple(digests), None)
                        else:  # the listed size: an unchanged file is not read again
                            content[(index, e[0])] = (int(e[3]), (), skipped)
                kind, _ = await frames.next(0)
                if kind != b"Z":
                    raise CheckpointError(f"unexpected frame {kind!r} from the sandbox")
                await uploader.flush()
                return True

            # the task group holds the uploader's background batch; the stream's own errors
            # are caught and raised after it (not as an exception group)
            async with anyio.create_task_group() as tg:
                uploader.tg = tg
                try:
                    complete = await stream()
                except Exception as exc:
                    failed = exc
                    tg.cancel_scope.cancel()
                else:
                    if not complete:
                        tg.cancel_scope.cancel()
            if failed is not None:
                raise failed
            if not complete:
                return None
            await proc.finish()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await proc.kill()
            raise
    entries = _entries(listings[0], 0, content, reuse_ws, pattern, thread_id)
    session_part = None
    if session is not None:
        s_entries = _entries(listings[1], 1, content, reuse_s, pattern, thread_id)
        session_part = SessionPart(session.harness, session.session_id, session.root,
                                   s_entries)
    elif attached is not None:
        session_part = attached
    cp = Checkpoint(
        checkpoint_id=checkpoint_id or f"ckpt-{uuid.uuid4().hex}",
        thread_id=thread_id,
        run_id=run_id,
        created_at=time.time() if now is None else now,
        root=handle.workdir,
        entries=entries,
        parent_id=parent.checkpoint_id if parent is not None else None,
        total_bytes=sum(e.size for e in entries) + (
            sum(e.size for e in session_part.entries) if session_part else 0),
        session=session_part,
        scan=_fingerprint(items, _secrets.token_bytes(16)),
        meta={**(meta or {}), "sent_bytes": uploader.sent},
    )
    await store.put_checkpoint(cp, now=now)
    return cp


def _named_secrets(listing: Any, pattern: Any) -> set[str]:
    """The listed paths whose name or link target holds a secret, or that lie under one."""
    if pattern is None or not isinstance(listing, dict):
        return set()
    out: set[str] = set()
    for raw in listing.get("entries", ()):
        try:
            path, target = str(raw[0]), raw[6]
        except (IndexError, TypeError, KeyError):
            continue
        parent = path.rpartition("/")[0]
        if parent in out or pattern.search(path.encode("utf-8", "surrogateescape")) or (
                isinstance(target, str)
                and pattern.search(target.encode("utf-8", "surrogateescape"))):
            out.add(path)
    return out


def _too_large(total: int, cap: int, on_too_large: str) -> None:
    error = CheckpointTooLarge(total, cap)
    if on_too_large == "error":
        raise error
    log.warning("checkpoint skipped: %s", error)
    return None


def _entries(listing: Any, index: int,
             content: dict[tuple[int, str], tuple[int, tuple[str, ...], str | None]],
             reuse: dict[str, CheckpointEntry], pattern: Any, thread_id: str
             ) -> tuple[CheckpointEntry, ...]:
    """The manifest entries of one root's listing (untrusted: checked here and by
    :func:`check_entries`); entries whose path or target holds a secret, and everything
    under them, are left out."""
    out: list[CheckpointEntry] = []
    dropped: list[str] = []
    for raw in listing.get("entries", ()):
        try:
            path, kind, mode, size, mtime_ns, stamp, target, need = raw
            if not isinstance(path, str):
                raise TypeError(f"path {path!r} is not a string")
        except (ValueError, TypeError) as exc:
            raise CheckpointError(f"the sandbox listed a bad entry: {exc}") from None
        if dropped and any(path.startswith(d + "/") for d in dropped):
            continue
        if pattern is not None and (
                pattern.search(path.encode("utf-8", "surrogateescape"))
                or (isinstance(target, str)
                    and pattern.search(target.encode("utf-8", "surrogateescape")))):
            log.warning("checkpoint of thread %s: an entry whose name or link target holds a "
                        "secret value was left out", thread_id)
            dropped.append(path)
            continue
        if kind == "file":
            if need:
                got = content.get((index, path))
                if got is None:
                    raise CheckpointError(f"the sandbox sent no content for {path!r}")
                size, chunks, skipped = got
            else:
                old = reuse.get(path)
                if old is None:
                    raise CheckpointError(f"the sandbox skipped {path!r}, which the parent "
                                          "checkpoint does not hold")
                if old.mode == int(mode) & 0o7777 and old.mtime_ns == mtime_ns \
                        and old.stamp == stamp:
                    out.append(old)  # the parent's entry itself (already checked)
                    continue
                chunks, skipped = old.chunks, old.skipped
                size = old.size
            out.append(CheckpointEntry(path, "file", int(mode) & 0o7777, int(size), chunks,
                                       None, int(mtime_ns), str(stamp), skipped))
        elif kind == "dir":
            out.append(CheckpointEntry(path, "dir", int(mode) & 0o7777, 0, (), None,
                                       int(mtime_ns)))
        elif kind == "symlink":
            out.append(CheckpointEntry(path, "symlink", int(mode) & 0o7777, 0, (), target,
                                       int(mtime_ns)))
    # the rules (every parent a directory of the manifest…) are checked once, when the
    # store is given the manifest: a listing that breaks them is CorruptCheckpoint there
    return tuple(out)


async def restore_checkpoint(
    handle: Handle,
    store: CheckpointStore,
    checkpoint: Checkpoint | str,
    *,
    session: bool = True,
    python: str = SANDBOX_PYTHON,
) -> Checkpoint:
    """Make ``handle``'s workspace (its workdir) what ``checkpoint`` (or its id) holds:
    everything else in it is removed. With ``session``, the saved session's directory is
    restored as well. Files left out of the checkpoint (secrets, unreadable) are absent.
    Raises :class:`~corral.stores.UnknownCheckpoint`, :class:`~corral.stores.CorruptCheckpoint`
    (a manifest or chunk that breaks the rules: nothing is sent) or
    :class:`CheckpointError`."""
    if isinstance(checkpoint, str):
        found = await store.get_checkpoint(checkpoint)
        if found is None:
            raise UnknownCheckpoint(checkpoint)
        checkpoint = found
    check_entries(checkpoint.entries)
    parts: list[tuple[str, tuple[CheckpointEntry, ...]]] = [(".", checkpoint.entries)]
    if session and checkpoint.session is not None:
        check_entries(checkpoint.session.entries)
        parts.append((checkpoint.session.root, checkpoint.session.entries))
    header = {"op": "restore", "chunk": CHUNK_BYTES, "roots": [
        {"root": root, "entries": [
            [e.path, e.kind, e.mode, e.size, e.mtime_ns, e.target,
             1 if e.kind == "file" and e.skipped is None else 0]
            for e in entries if not (e.kind == "file" and e.skipped is not None)]}
        for root, entries in parts]}
    head = json.dumps(header).encode()
    files = [e for _root, entries in parts for e in entries
             if e.kind == "file" and e.skipped is None]
    err: list[bytes] = []
    out: list[bytes] = []
    proc = await _spawn(handle, python, handle.workdir)

    async def read_out() -> None:
        async for part in proc.stdout:
            if sum(map(len, out)) < 4096:
                out.append(part)

    try:
        try:
            await proc.write_stdin(_HEAD.pack(b"H", len(head)) + head)
            await _send_files(proc, store, files)
        except (BrokenPipeError, anyio.BrokenResourceError):
            pass  # the script refused and exited: its answer says why
        finally:
            await proc.close_stdin()
        result = await proc.wait()
        # read after the exit: the script writes one short line (and a traceback at worst),
        # well under a pipe's buffer
        await read_out()
        await _stderr_of(proc, err)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await proc.kill(signal.SIGKILL)
        raise
    finally:
        await _release(proc)
    answer = b"".join(out).decode("utf-8", "replace").strip()
    if not result.ok or answer != '{"ok": true}':
        detail = answer or b"".join(err)[-500:].decode("utf-8", "replace").strip()
        try:
            detail = str(json.loads(detail).get("error", detail))
        except (ValueError, AttributeError):
            pass
        raise CheckpointError(f"restoring checkpoint {checkpoint.checkpoint_id} in the "
                              f"sandbox failed ({result.describe()}): {detail[:500]}")
    return checkpoint


async def _send_files(proc: Process, store: CheckpointStore, files: list[CheckpointEntry]
                      ) -> None:
    """Each file's chunks then an end frame, fetched from the store a batch ahead."""
    batches: list[list[CheckpointEntry]] = [[]]
    size = 0
    for e in files:
        if batches[-1] and size + e.size > _BATCH_BYTES:
            batches.append([])
            size = 0
        batches[-1].append(e)
        size += e.size

    async def fetch(batch: list[CheckpointEntry]) -> dict[str, bytes]:
        wanted = {d for e in batch for d in e.chunks}
        got = await store.get_chunks(wanted)
        lost = wanted - set(got)
        if lost:
            raise CheckpointError(f"the store lacks {len(lost)} chunk(s) of this checkpoint")
        return await anyio.to_thread.run_sync(
            lambda: {d: _decode(d, data) for d, data in got.items()})

    async def prefetch(batch: list[CheckpointEntry], slot: dict[str, Any],
                       done: anyio.Event) -> None:
        try:
            slot["chunks"] = await fetch(batch)
        except Exception as exc:  # raised by the writing loop (not as an exception group)
            slot["error"] = exc
        finally:
            done.set()

    end = _HEAD.pack(b"E", 0)
    failed: Exception | None = None
    # the next batch is fetched and checked while this one is written into the sandbox
    async with anyio.create_task_group() as tg:

        def start(batch: list[CheckpointEntry]) -> tuple[dict[str, Any], anyio.Event]:
            slot: dict[str, Any] = {}
            done = anyio.Event()
            tg.start_soon(prefetch, batch, slot, done)
            return slot, done

        try:
            ahead = start(batches[0])
            for i, batch in enumerate(batches):
                slot, done = ahead
                await done.wait()
                if "error" in slot:
                    raise slot["error"]
                if i + 1 < len(batches):
                    ahead = start(batches[i + 1])
                chunks: dict[str, bytes] = slot["chunks"]
                out: list[bytes] = []
                for e in batch:
                    for d in e.chunks:
                        raw = chunks[d]
                        out.append(_HEAD.pack(b"D", len(raw)))
                        out.append(raw)
                    out.append(end)
                del slot, chunks
                await proc.write_stdin(b"".join(out))
        except Exception as exc:
            failed = exc
            tg.cancel_scope.cancel()
    if failed is not None:
        raise failed
