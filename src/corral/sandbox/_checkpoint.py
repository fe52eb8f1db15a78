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

Its parts: the chunks in the store (:mod:`~corral.sandbox._checkpoint_chunks`), the secret
scan (:mod:`~corral.sandbox._checkpoint_scan`), the script and its frames
(:mod:`~corral.sandbox._checkpoint_script`; on the host: :mod:`~corral.sandbox._checkpoint_host`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets as _secrets
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import anyio
import anyio.to_thread

from corral.sandbox._checkpoint_chunks import (
    BATCH_BYTES,
    CHUNK_BYTES,
    ChunkUploader,
    decode,
)
from corral.sandbox._checkpoint_scan import (
    ContentScanner,
    Secrets,
    fingerprint,
    named_secrets,
    same_secrets,
    secret_items,
)
from corral.sandbox._checkpoint_script import (
    HEAD,
    MAX_HEADER,
    CheckpointError,
    Frames,
    HostSource,
    SandboxSource,
    first_bytes,
    host_source,
    host_workspace,
    running_script,
    sandbox_source,
)
from corral.sandbox._contracts import Handle, Process
from corral.sandbox._leakscan import _pattern
from corral.stores._checkpoints import (
    Checkpoint,
    CheckpointEntry,
    MissingChunks,
    SessionPart,
    UnknownCheckpoint,
    check_entries,
)
from corral.stores._protocols import CheckpointStore

__all__ = [
    "CheckpointTooLarge",
    "DEFAULT_MAX_BYTES",
    "SessionSource",
    "checkpoint_workspace",
    "restore_checkpoint",
]

log = logging.getLogger("corral.sandbox.checkpoint")

DEFAULT_MAX_BYTES: Final = 1 << 30
"""The default size cap of a checkpoint: 1 GiB of file content."""
SANDBOX_PYTHON: Final = "/usr/bin/python3"

Content = dict[tuple[int, str], tuple[int, tuple[str, ...], str | None]]
"""What was read of each file, by (root index, path): its size, its chunks' digests, and
why it was left out (``None``: kept)."""


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
        return await _checkpoint(handle, store, thread_id, run_id, secret_items(secrets),
                                 max_bytes, on_too_large, parent, session, checkpoint_id,
                                 python, now, session_part, meta, host_read)
    except MissingChunks:
        # A chunk the parent named was collected underneath us (its manifest deleted
        # meanwhile): take the checkpoint again reading everything.
        if parent is None:
            raise
        return await _checkpoint(handle, store, thread_id, run_id, secret_items(secrets),
                                 max_bytes, on_too_large, None, session, checkpoint_id,
                                 python, now, session_part, meta, host_read)


async def _checkpoint(
    handle: Handle, store: CheckpointStore, thread_id: str, run_id: str | None,
    items: list[tuple[str, str]], max_bytes: int | None, on_too_large: str,
    parent: Checkpoint | None, session: SessionSource | None, checkpoint_id: str | None,
    python: str, now: float | None, attached: SessionPart | None = None,
    meta: Mapping[str, Any] | None = None, host_read: bool = True,
) -> Checkpoint | None:
    same = parent is not None and same_secrets(parent.scan, items)
    reuse_ws = _known(parent, same, parent.entries if parent else ())
    parent_session = parent.session if parent is not None else None
    reuse_s = {} if session is None or parent_session is None or \
        parent_session.root != session.root else _known(parent, same, parent_session.entries)
    roots = ["."] + ([session.root] if session is not None else [])
    request = _save_request(roots, [reuse_ws, reuse_s][:len(roots)])
    uploader = ChunkUploader(store, now)
    host_root = host_workspace(handle) if session is None and host_read else None
    async with (host_source(request, host_root) if host_root is not None
                else sandbox_source(handle, python, request)) as proc:
        save = _SaveStream(proc, len(roots), max_bytes, on_too_large, _pattern(items),
                           uploader, thread_id)
        try:
            if not await _stream_with_uploads(save, uploader):
                return None
            await proc.finish()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await proc.kill()
            raise
    pattern = save.pattern
    entries = _entries(save.listings[0], 0, save.content, reuse_ws, pattern, thread_id)
    session_part = attached
    if session is not None:
        s_entries = _entries(save.listings[1], 1, save.content, reuse_s, pattern, thread_id)
        session_part = SessionPart(session.harness, session.session_id, session.root,
                                   s_entries)
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
        scan=fingerprint(items, _secrets.token_bytes(16)),
        meta={**(meta or {}), "sent_bytes": uploader.sent},
    )
    await store.put_checkpoint(cp, now=now)
    return cp


async def _stream_with_uploads(save: _SaveStream, uploader: ChunkUploader) -> bool:
    """Read the whole save stream while the uploader's background batch is put (in the
    task group); the stream's own errors are raised after the group, not as an exception
    group. False: over the size cap, nothing stored."""
    failed: Exception | None = None
    complete = False
    async with anyio.create_task_group() as tg:
        uploader.tg = tg
        try:
            complete = await save.read()
        except Exception as exc:
            failed = exc
            tg.cancel_scope.cancel()
        else:
            if not complete:
                tg.cancel_scope.cancel()
    if failed is not None:
        raise failed
    return complete


@dataclass
class _SaveStream:
    """The script's answer to a save request, read frame by frame: the listing of every
    root, then each file it reads as chunks, scanned for secrets before any is uploaded."""

    proc: SandboxSource | HostSource
    roots: int
    max_bytes: int | None
    on_too_large: str
    scan: tuple[Any, dict[bytes, str], int]
    """The secret matcher: pattern, value → name, longest value."""
    uploader: ChunkUploader
    thread_id: str
    listings: list[Any] = field(default_factory=list)
    content: Content = field(default_factory=dict)
    received: int = 0

    @property
    def pattern(self) -> Any:
        return self.scan[0]

    async def read(self) -> bool:
        """Read it all; False when over the size cap (the script killed, nothing stored)."""
        frames = Frames(self.proc.stdout)
        self.listings = await self._listing(frames)
        total = sum(int(e[3]) for r in self.listings for e in r.get("entries", ())
                    if e[1] == "file")
        if not await self._within_cap(total):
            return False
        for index, listing in enumerate(self.listings):
            named = named_secrets(listing, self.pattern)
            for e in listing.get("entries", ()):
                if e[7] and not await self._file(frames, index, e, e[0] in named):
                    return False
        kind, _ = await frames.next(0)
        if kind != b"Z":
            raise CheckpointError(f"unexpected frame {kind!r} from the sandbox")
        await self.uploader.flush()
        return True

    async def _listing(self, frames: Frames) -> list[Any]:
        kind, head = await frames.next(MAX_HEADER)
        if kind != b"H":
            raise CheckpointError("the sandbox's checkpoint output has no listing")
        try:
            listings = json.loads(head)["roots"]
            if not isinstance(listings, list) or len(listings) != self.roots:
                raise ValueError("wrong number of roots")
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"the sandbox's checkpoint listing is malformed: {exc}"
                                  ) from None
        return listings

    async def _within_cap(self, size: int) -> bool:
        if self.max_bytes is not None and size > self.max_bytes:
            await self.proc.kill()
            _too_large(size, self.max_bytes, self.on_too_large)
            return False
        return True

    async def _file(self, frames: Frames, index: int, e: Any, named: bool) -> bool:
        """One file's frames: its chunks (held back until scanned), then its end or why it
        could not be read. False when over the size cap."""
        scanner = ContentScanner(*self.scan)
        if named:  # left out of the manifest: its content is not kept
            scanner.found = "-"
        digests: list[str] = []
        size = 0
        skipped: str | None = None
        while True:
            kind, data = await frames.next(CHUNK_BYTES)
            if kind == b"D":
                size += len(data)
                self.received += len(data)
                if not await self._within_cap(self.received):
                    return False
                scanner.feed(data)
                if scanner.found is None:
                    digest = hashlib.sha256(data).hexdigest()
                    digests.append(digest)
                    scanner.held.append((digest, data))
                    if len(scanner.held) > 1:
                        await self.uploader.add(*scanner.held.pop(0))
            elif kind == b"E":
                break
            elif kind == b"X":
                skipped = "unreadable"
                log.warning("checkpoint of thread %s: %s left out, unreadable "
                            "in the sandbox (%s)", self.thread_id, e[0],
                            data[:200].decode("utf-8", "replace"))
                break
            else:
                raise CheckpointError(f"unexpected frame {kind!r} from the sandbox")
        if scanner.found == "-":
            return True
        if scanner.found is not None:
            skipped = "secret"
            log.warning("checkpoint of thread %s: %s left out, it holds the "
                        "value of secret %s", self.thread_id, e[0], scanner.found)
        if skipped is None:
            for held in scanner.held:
                await self.uploader.add(*held)
            self.content[(index, e[0])] = (size, tuple(digests), None)
        else:  # the listed size: an unchanged file is not read again
            self.content[(index, e[0])] = (int(e[3]), (), skipped)
        return True


def _too_large(total: int, cap: int, on_too_large: str) -> None:
    error = CheckpointTooLarge(total, cap)
    if on_too_large == "error":
        raise error
    log.warning("checkpoint skipped: %s", error)
    return None


def _entries(listing: Any, index: int,
             content: Content,
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
    async with running_script(handle, python) as proc:
        try:
            await proc.write_stdin(HEAD.pack(b"H", len(head)) + head)
            await _send_files(proc, store, files)
        except (BrokenPipeError, anyio.BrokenResourceError):
            pass  # the script refused and exited: its answer says why
        finally:
            await proc.close_stdin()
        result = await proc.wait()
        # read after the exit: the script writes one short line (and a traceback at worst),
        # well under a pipe's buffer
        await first_bytes(proc.stdout, out)
        await first_bytes(proc.stderr, err)
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
        if batches[-1] and size + e.size > BATCH_BYTES:
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
            lambda: {d: decode(d, data) for d, data in got.items()})

    async def prefetch(batch: list[CheckpointEntry], slot: dict[str, Any],
                       done: anyio.Event) -> None:
        try:
            slot["chunks"] = await fetch(batch)
        except Exception as exc:  # raised by the writing loop (not as an exception group)
            slot["error"] = exc
        finally:
            done.set()

    end = HEAD.pack(b"E", 0)
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
                        out.append(HEAD.pack(b"D", len(raw)))
                        out.append(raw)
                    out.append(end)
                del slot, chunks
                await proc.write_stdin(b"".join(out))
        except Exception as exc:
            failed = exc
            tg.cancel_scope.cancel()
    if failed is not None:
        raise failed
