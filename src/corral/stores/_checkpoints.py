"""Checkpoints in the store (#27): the values, their rules, their stored form, the errors.

A checkpoint is a *manifest* (every entry of a workspace: path, kind, mode, size, the
SHA-256 digests of its content's chunks, a symlink's target) plus the *chunks* it names,
kept once per digest and shared by every checkpoint and thread that holds the same bytes.
So twenty turns of one-file edits on a 100 MiB workspace store about 100 MiB of chunks and
twenty small manifests.

The rules a manifest obeys are checked here, once, for every backend and every reader
(:func:`check_entries`): relative paths without ``.``/``..``/empty components or NUL, each
path once, and every entry's parent a ``dir`` entry of the same manifest. The last rule is
what makes a restore safe by construction: no entry is ever reached through a symlink the
restore itself made. A manifest read back from a store passes them again (the bytes came
from a sandbox, the store may be shared), and one that fails is :class:`CorruptCheckpoint`.

Chunk garbage collection and a concurrent writer: a writer puts its chunks (or learns
from :meth:`~corral.abc.CheckpointStore.missing_chunks` that they are there, which *touches*
them), then puts the manifest. The collector deletes only chunks that no manifest names
**and** that nobody put or touched for ``grace`` seconds, so a writer between those two
steps keeps its chunks. And ``put_checkpoint`` checks, in the transaction that stores the
manifest, that every chunk it names is present (:class:`MissingChunks` otherwise, nothing
stored); the collector and ``put_checkpoint`` serialize (one SQLite writer; an advisory lock
on PostgreSQL), so a manifest can never name a chunk the collector removed, whatever the
timing: at worst the writer is told to put the chunks again.
"""

from __future__ import annotations

import json
import re
import weakref
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from corral._ids import valid_id
from corral.stores._protocols import StoreError
from corral.stores._records import RunRecord

__all__ = [
    "CHUNK_GRACE",
    "Checkpoint",
    "CheckpointEntry",
    "CheckpointExists",
    "CheckpointInfo",
    "ChunkStats",
    "CorruptCheckpoint",
    "EntryKind",
    "MissingChunks",
    "SessionPart",
    "ThreadHead",
    "UnknownCheckpoint",
    "check_digest",
    "check_entries",
    "check_entry_path",
    "manifest_from_bytes",
    "manifest_to_bytes",
]

EntryKind = Literal["file", "dir", "symlink"]
_KINDS: Final = frozenset({"file", "dir", "symlink"})
_DIGEST: Final = re.compile(r"[0-9a-f]{64}")
_BAD_COMPONENT: Final = re.compile(r"(?:^|/)\.{0,2}(?:/|$)")
"""An empty, ``.`` or ``..`` component (or a leading ``/``)."""
MAX_PATH: Final = 4096
CHUNK_GRACE: Final = 3600.0
"""Seconds a chunk nobody names is kept after it was last put or touched (the collector's
default grace): the longest a writer may take between its chunks and its manifest."""
_FORMAT: Final = 1


# --------------------------------------------------------------------------- errors


class UnknownCheckpoint(StoreError, LookupError):
    """No checkpoint with this id exists."""

    def __init__(self, checkpoint_id: str) -> None:
        super().__init__(f"no checkpoint with id {checkpoint_id!r} exists in this store")
        self.checkpoint_id = checkpoint_id


class CheckpointExists(StoreError):
    """``put_checkpoint`` was given an id that is taken (checkpoint ids are unique)."""

    def __init__(self, checkpoint_id: str) -> None:
        super().__init__(f"checkpoint {checkpoint_id!r} already exists; ids are unique")
        self.checkpoint_id = checkpoint_id


class MissingChunks(StoreError):
    """``put_checkpoint`` named chunks the store does not hold (never put, or collected
    before the manifest came); nothing was stored. Put them again, then the manifest."""

    def __init__(self, checkpoint_id: str, digests: Iterable[str]) -> None:
        self.digests = frozenset(digests)
        super().__init__(
            f"checkpoint {checkpoint_id!r} names {len(self.digests)} chunk(s) this store does "
            "not hold; put the chunks, then the checkpoint again")
        self.checkpoint_id = checkpoint_id


class CorruptCheckpoint(StoreError, ValueError):
    """A manifest breaks the rules of :func:`check_entries` (a path that climbs out, an
    entry under a symlink, a bad digest…): refused, never restored."""


# --------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True, weakref_slot=True)
class CheckpointEntry:
    """One entry of a checkpointed tree.

    ``path`` is relative to the tree's root (POSIX, ``/``-separated). ``mode`` holds the
    permission bits. A file's content is the concatenation of its ``chunks`` (SHA-256 hex
    digests of the raw bytes); ``size`` is its length. ``mtime_ns`` is restored;
    ``stamp`` is an opaque token of the file's identity and change time in the sandbox
    where it was read (equal stamps, size and mtime: the content is the parent's, not read
    again). ``skipped`` says why a file's content was left out (``"secret"``: it held a
    secret value; ``"unreadable"``): such a file has no chunks and is not restored."""

    path: str
    kind: EntryKind
    mode: int
    size: int = 0
    chunks: tuple[str, ...] = ()
    target: str | None = None
    mtime_ns: int = 0
    stamp: str = ""
    skipped: str | None = None

    def to_json(self) -> list[Any]:
        return [self.path, self.kind, self.mode, self.size, list(self.chunks), self.target,
                self.mtime_ns, self.stamp, self.skipped]

    @classmethod
    def from_json(cls, raw: Any) -> CheckpointEntry:
        if not isinstance(raw, list) or len(raw) != 9:
            raise CorruptCheckpoint("checkpoint entry: expected a list of 9 fields")
        path, kind, mode, size, chunks, target, mtime_ns, stamp, skipped = raw
        if not isinstance(chunks, list):
            raise CorruptCheckpoint(f"checkpoint entry {path!r}: chunks must be a list")
        entry = cls(path, kind, mode, size, tuple(chunks), target, mtime_ns, stamp, skipped)
        _check_entry_once(entry)
        return entry


@dataclass(frozen=True, slots=True)
class SessionPart:
    """The agent CLI's saved session in a checkpoint: which harness, its session id, where
    its files live in the sandbox (an absolute directory) and their entries (relative to
    ``root``, the same rules as the workspace's)."""

    harness: str
    session_id: str
    root: str
    entries: tuple[CheckpointEntry, ...] = ()


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A checkpoint of a thread's workspace after a run (and of its saved session).

    ``root`` is the directory that was checkpointed (the sandbox's workdir),
    ``total_bytes`` the sum of the files' sizes, ``scan`` a salted fingerprint of the
    secret values the content was checked against (never the values; see
    :mod:`corral.sandbox` checkpoints), ``parent_id`` the checkpoint this one was taken
    after (its unchanged files' digests were reused)."""

    checkpoint_id: str
    thread_id: str
    run_id: str | None
    created_at: float
    root: str
    entries: tuple[CheckpointEntry, ...]
    parent_id: str | None = None
    total_bytes: int = 0
    session: SessionPart | None = None
    scan: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("checkpoint_id", "thread_id"):
            if not valid_id(getattr(self, name)):
                raise StoreError(f"checkpoint: {name} {getattr(self, name)!r} is not a valid id")
        for name in ("run_id", "parent_id"):
            value = getattr(self, name)
            if value is not None and not valid_id(value):
                raise StoreError(f"checkpoint: {name} {value!r} is not a valid id")

    def digests(self) -> set[str]:
        """Every chunk digest the checkpoint names (workspace and session)."""
        out = {d for e in self.entries for d in e.chunks}
        if self.session is not None:
            out.update(d for e in self.session.entries for d in e.chunks)
        return out

    def info(self) -> CheckpointInfo:
        """The summary :meth:`~corral.abc.CheckpointStore.list_checkpoints` gives."""
        return CheckpointInfo(self.checkpoint_id, self.thread_id, self.run_id,
                              self.parent_id, self.created_at, self.total_bytes,
                              len(self.entries), self.session is not None)


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """A checkpoint without its entries (what a thread listing shows)."""

    checkpoint_id: str
    thread_id: str
    run_id: str | None
    parent_id: str | None
    created_at: float
    total_bytes: int
    entry_count: int
    has_session: bool


@dataclass(frozen=True, slots=True)
class ThreadHead:
    """A thread's current state as :meth:`~corral.abc.Store.thread_head` reads it: its
    newest checkpoint (whole) and its newest run (``None`` when it has none)."""

    checkpoint: Checkpoint | None
    last_run: RunRecord | None


@dataclass(frozen=True, slots=True)
class ChunkStats:
    """How many chunks a store holds and their stored (encoded) bytes."""

    count: int
    stored_bytes: int


# --------------------------------------------------------------------------- rules


def check_digest(digest: object) -> str:
    """``digest`` if it is a SHA-256 hex digest (64 lowercase hex digits), else
    :class:`StoreError`."""
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise StoreError(f"a chunk digest must be 64 lowercase hex digits, got {digest!r}")
    return digest


def check_entry_path(path: object) -> str:
    """``path`` if it is a relative path that stays under its root (no ``.``, ``..`` or
    empty components, no leading ``/``, no NUL, at most 4096 bytes), else
    :class:`CorruptCheckpoint`."""
    if not isinstance(path, str) or not path:
        raise CorruptCheckpoint(f"checkpoint entry: path must be a non-empty string, got {path!r}")
    if "\0" in path or path.startswith("/") or len(path.encode("utf-8", "surrogateescape")) > MAX_PATH:
        raise CorruptCheckpoint(f"checkpoint entry path {path[:200]!r} is absolute, too long or "
                                "holds NUL; refused")
    if _BAD_COMPONENT.search(path):
        raise CorruptCheckpoint(f"checkpoint entry path {path[:200]!r} has an empty, '.' or '..' "
                                "component; refused")
    return path


def _check_entry(e: CheckpointEntry) -> None:
    check_entry_path(e.path)
    if e.kind not in _KINDS:
        raise CorruptCheckpoint(f"checkpoint entry {e.path!r}: unknown kind {e.kind!r}")
    for name in ("mode", "size", "mtime_ns"):
        value = getattr(e, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise CorruptCheckpoint(f"checkpoint entry {e.path!r}: {name} must be a "
                                    f"non-negative integer, got {value!r}")
    if e.mode > 0o7777:
        raise CorruptCheckpoint(f"checkpoint entry {e.path!r}: mode {e.mode:o} is not "
                                "permission bits")
    if not isinstance(e.stamp, str) or (e.skipped is not None and not isinstance(e.skipped, str)):
        raise CorruptCheckpoint(f"checkpoint entry {e.path!r}: stamp/skipped must be strings")
    try:
        for d in e.chunks:
            check_digest(d)
    except StoreError as exc:
        raise CorruptCheckpoint(f"checkpoint entry {e.path!r}: {exc}") from None
    if e.kind == "symlink":
        if not isinstance(e.target, str) or not e.target or "\0" in e.target:
            raise CorruptCheckpoint(f"checkpoint entry {e.path!r}: a symlink needs a target")
    elif e.target is not None:
        raise CorruptCheckpoint(f"checkpoint entry {e.path!r}: only a symlink has a target")
    if e.kind != "file" and (e.chunks or e.size):
        raise CorruptCheckpoint(f"checkpoint entry {e.path!r}: only a file has content")
    if e.kind == "file" and e.skipped is None and e.size > 0 and not e.chunks:
        raise CorruptCheckpoint(f"checkpoint entry {e.path!r}: {e.size} bytes but no chunks")


_CHECKED: weakref.WeakValueDictionary[int, CheckpointEntry] = weakref.WeakValueDictionary()
"""Entries that passed :func:`_check_entry`, by identity (never by equality: ``True == 1``
and ``1.0 == 1`` would let a bad field pass as a good one), so the unchanged entries a
child checkpoint shares with its parent are not checked again on every put. Entries are
frozen, so a checked entry stays valid."""


def _check_entry_once(e: CheckpointEntry) -> None:
    if _CHECKED.get(id(e)) is e:
        return
    _check_entry(e)
    if type(e.chunks) is tuple:  # nothing in it can change afterwards
        _CHECKED[id(e)] = e


def check_entries(entries: Sequence[CheckpointEntry]) -> None:
    """Refuse (:class:`CorruptCheckpoint`) a tree a restore could be steered out of: every
    entry valid, each path once, and every entry's parent directory a ``dir`` entry."""
    kinds: dict[str, str] = {}
    for e in entries:
        if not isinstance(e, CheckpointEntry):
            raise CorruptCheckpoint(f"checkpoint entry: expected a CheckpointEntry, got {e!r}")
        _check_entry_once(e)
        if e.path in kinds:
            raise CorruptCheckpoint(f"checkpoint entry {e.path!r} appears twice")
        kinds[e.path] = e.kind
    for e in entries:
        parent = e.path.rpartition("/")[0]
        if parent and kinds.get(parent) != "dir":
            raise CorruptCheckpoint(
                f"checkpoint entry {e.path!r}: its parent {parent!r} is not a directory of "
                "the checkpoint (an entry under a symlink or a file); refused")


# --------------------------------------------------------------------------- stored form


def manifest_to_bytes(cp: Checkpoint) -> bytes:
    """The stored form of a checkpoint: zlib-compressed ASCII JSON (file names that are not
    UTF-8 survive as escaped surrogates), checked first."""
    check_entries(cp.entries)
    doc: dict[str, Any] = {
        "format": _FORMAT,
        "checkpoint_id": cp.checkpoint_id,
        "thread_id": cp.thread_id,
        "run_id": cp.run_id,
        "parent_id": cp.parent_id,
        "created_at": cp.created_at,
        "root": cp.root,
        "total_bytes": cp.total_bytes,
        "scan": cp.scan,
        "meta": dict(cp.meta),
        "entries": [e.to_json() for e in cp.entries],
    }
    if cp.session is not None:
        check_entries(cp.session.entries)
        doc["session"] = {"harness": cp.session.harness, "session_id": cp.session.session_id,
                          "root": cp.session.root,
                          "entries": [e.to_json() for e in cp.session.entries]}
    try:
        text = json.dumps(doc, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"checkpoint {cp.checkpoint_id}: meta is not JSON: {exc}") from None
    return zlib.compress(text.encode("ascii"), 1)


def manifest_from_bytes(data: bytes) -> Checkpoint:
    """A checkpoint from its stored form, every rule checked again
    (:class:`CorruptCheckpoint` otherwise)."""
    try:
        doc = json.loads(zlib.decompress(data))
    except (zlib.error, ValueError) as exc:
        raise CorruptCheckpoint(f"a stored checkpoint manifest is unreadable: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
        raise CorruptCheckpoint("a stored checkpoint manifest has an unknown format; "
                                "upgrade corral")
    try:
        entries = tuple(CheckpointEntry.from_json(e) for e in doc["entries"])
        check_entries(entries)
        session = None
        if doc.get("session") is not None:
            s = doc["session"]
            s_entries = tuple(CheckpointEntry.from_json(e) for e in s["entries"])
            check_entries(s_entries)
            session = SessionPart(str(s["harness"]), str(s["session_id"]), str(s["root"]),
                                  s_entries)
        return Checkpoint(
            checkpoint_id=doc["checkpoint_id"], thread_id=doc["thread_id"],
            run_id=doc["run_id"], created_at=float(doc["created_at"]), root=str(doc["root"]),
            entries=entries, parent_id=doc["parent_id"], total_bytes=int(doc["total_bytes"]),
            session=session, scan=str(doc["scan"]), meta=dict(doc["meta"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, StoreError):
            raise CorruptCheckpoint(str(exc)) from None
        raise CorruptCheckpoint(f"a stored checkpoint manifest is malformed: {exc!r}") from None


def check_chunks(chunks: Mapping[str, bytes]) -> None:
    """Every key a digest, every value bytes (:class:`StoreError` otherwise)."""
    for digest, data in chunks.items():
        check_digest(digest)
        if not isinstance(data, bytes | bytearray | memoryview):
            raise StoreError(f"chunk {digest}: data must be bytes, got {type(data).__name__}")
