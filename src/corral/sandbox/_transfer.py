"""Stream a host directory into a sandbox as a tar archive, in bounded memory.

The archive is unpacked *inside* the sandbox (``tar -x`` as the sandbox's user), so
symlinks already in the workspace resolve within the sandbox and cannot redirect a write
onto the host, and ownership comes out right without any chown on the host. Symlinks in
the source are copied as links, never followed, so nothing outside the source is read.

The archive is produced by a worker thread and written to ``tar``'s stdin in chunks of
:data:`CHUNK` bytes as it is made: memory stays at a few chunks whatever the size of the
tree. Two passes over the tree: the first sums the sizes (stopping as soon as the copy
limit is passed, before a byte is sent) and gives progress its total; the second streams,
and enforces the limit again for files that grew in between.

corral's own state is left out (see :mod:`corral.sandbox._copyguard`), with a warning
naming each path left out.
"""

from __future__ import annotations

import contextlib
import fnmatch
import io
import os
import stat
import tarfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import anyio
import anyio.from_thread
import anyio.to_thread

from corral._errors import CorralError
import corral._validate as v
from corral.sandbox._contracts import Handle
from corral.sandbox._copyguard import StateGuard
from corral.sandbox._ignore import Kept, kept_files
from corral.sandbox._redact import get_logger

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = [
    "CHUNK",
    "DEFAULT_MAX_COPY_SIZE",
    "MAX_COPY_SIZE_ENV",
    "CopyLimit",
    "CopyProgress",
    "CopyStats",
    "CopyTooLarge",
    "ProgressCallback",
    "TransferError",
    "copy_dir_into",
    "report_copy_progress",
]

log = get_logger("corral.sandbox._transfer")

CHUNK = 1 << 20
"""Bytes per write to ``tar``'s stdin (and per read of a source file)."""
DEFAULT_MAX_COPY_SIZE = 1 << 30
"""The copy limit when nothing sets one: 1 GiB of file contents."""
MAX_COPY_SIZE_ENV = "CORRAL_MAX_COPY_SIZE"
"""Environment variable giving the copy limit when the workspace does not set one."""
PROGRESS_EVERY = 0.2
"""Seconds between progress reports (the last one is always sent)."""
_TAR_X = ("tar", "-x", "-f", "-", "--no-same-owner", "--no-same-permissions",
          "--delay-directory-restore")  # fmt: skip
_STDERR_TAIL = 4000


class TransferError(CorralError):
    """Copying files into the sandbox failed."""


class CopyTooLarge(TransferError):
    """The files to copy are more than the copy limit allows."""


# ------------------------------------------------------------------------ limit


@dataclass(frozen=True, slots=True)
class CopyLimit:
    """The most file content (bytes) one copy into a sandbox may carry, and what set it."""

    max_bytes: int
    origin: str = "the default"

    @classmethod
    def resolve(
        cls, configured: int | None = None, environ: Mapping[str, str] | None = None
    ) -> CopyLimit:
        """The workspace's ``max_copy_size`` when set, else ``$CORRAL_MAX_COPY_SIZE``, else
        :data:`DEFAULT_MAX_COPY_SIZE`."""
        if configured is not None:
            return cls(configured, "workspace.max_copy_size")
        raw = (os.environ if environ is None else environ).get(MAX_COPY_SIZE_ENV)
        if raw:
            return cls(v.size(raw, f"${MAX_COPY_SIZE_ENV}"), f"${MAX_COPY_SIZE_ENV}")
        return cls(DEFAULT_MAX_COPY_SIZE)

    def exceeded(self, source: Path, counted: int, files: int) -> CopyTooLarge:
        """The one-line error for a source that holds more than the limit."""
        return CopyTooLarge(
            f"{source} holds more than the workspace copy limit of {v.format_size(self.max_bytes)} "
            f"(set by {self.origin}; stopped counting at {v.format_size(counted)} in {files} "
            f"file{'' if files == 1 else 's'}): "
            f'raise it with max_copy_size = "4GiB" under [workspace] in corral.toml, '
            f"Workspace(max_copy_size=...), corral run --max-copy-size or ${MAX_COPY_SIZE_ENV}, "
            "or leave large paths out with workspace.source.exclude"
        )


# ------------------------------------------------------------------------ progress


@dataclass(frozen=True, slots=True)
class CopyProgress:
    """How far a copy into a sandbox has got. ``bytes_*`` count file contents."""

    source: str
    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int
    elapsed: float
    done: bool = False
    ignore_files: bool = False  # .gitignore / .corralignore honoured (some files left out)


ProgressCallback = Callable[[CopyProgress], None]
"""Called on the event loop's thread every :data:`PROGRESS_EVERY` seconds during a copy,
and once more with ``done=True`` when it finished. It must not block."""

_progress_var: ContextVar[ProgressCallback | None] = ContextVar("corral_copy_progress",
                                                                default=None)


@contextlib.contextmanager
def report_copy_progress(callback: ProgressCallback) -> Iterator[None]:
    """Send the progress of every copy made in this context (e.g. by ``ensure`` deep in a
    run's start) to ``callback``; for callers that do not call :func:`copy_dir_into`."""
    token = _progress_var.set(callback)
    try:
        yield
    finally:
        _progress_var.reset(token)


@dataclass(slots=True)
class _Counter:
    """Progress shared by the producing thread and the event loop (ints: GIL-atomic)."""

    source: str
    files_total: int = 0
    bytes_total: int = 0
    started: float = field(default_factory=time.monotonic)
    files_done: int = 0
    bytes_done: int = 0
    last_report: float = 0.0
    ignore_files: bool = False

    def snapshot(self, done: bool = False) -> CopyProgress:
        return CopyProgress(
            self.source, self.files_done, self.files_total,
            self.bytes_total if done else min(self.bytes_done, self.bytes_total),
            self.bytes_total, time.monotonic() - self.started, done, self.ignore_files,
        )  # fmt: skip


# ------------------------------------------------------------------------ the tree


@dataclass(frozen=True, slots=True)
class CopyStats:
    """What a copy carried, and what it left out (path, reason)."""

    files: int
    bytes: int
    skipped: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class _Entry:
    path: str
    rel: str
    kind: Literal["dir", "file", "link", "skip"]
    size: int = 0
    why: str = ""


def _excluded(rel: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(os.path.basename(rel), p)
               for p in patterns)  # fmt: skip


def _scandir(path: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError as exc:
        raise TransferError(f"cannot read directory {path}: {exc.strerror}") from None


def _walk(root: str, exclude: Sequence[str], guard: StateGuard,
          kept: Kept | None = None) -> Iterator[_Entry]:
    """Every entry under ``root``, parents first; symlinks are entries, never followed.

    A directory is yielded when it is visited, after the state check on its names, so a
    directory of corral's state leaves no trace (it is yielded as ``skip``). Devices,
    fifos and sockets are not copied. With ``kept`` (the ignore files' verdict), only what
    it keeps is visited."""
    stack: list[tuple[str, str]] = [(root, "")]
    while stack:
        path, rel = stack.pop()
        entries = _scandir(path)
        if rel:
            why = guard.skip_dir(path, [e.name for e in entries])
            if why is not None:
                yield _Entry(path, rel, "skip", why=why)
                continue
            yield _Entry(path, rel, "dir")
        subdirs: list[tuple[str, str]] = []
        for e in entries:
            sub = f"{rel}/{e.name}" if rel else e.name
            if _excluded(sub, exclude):
                continue
            mode = e.stat(follow_symlinks=False).st_mode
            if kept is not None and not (kept.keeps_dir(sub) if stat.S_ISDIR(mode)
                                         else kept.keeps_file(sub)):
                continue
            if stat.S_ISDIR(mode):
                subdirs.append((e.path, sub))
            elif stat.S_ISLNK(mode):
                yield _Entry(e.path, sub, "link")
            elif stat.S_ISREG(mode):
                why = guard.skip_file(e.path, e.name)
                if why is not None:
                    yield _Entry(e.path, sub, "skip", why=why)
                else:
                    yield _Entry(e.path, sub, "file", e.stat(follow_symlinks=False).st_size)
        stack.extend(reversed(subdirs))


@dataclass(frozen=True, slots=True)
class _Plan:
    files: int
    bytes: int
    skipped: tuple[tuple[str, str], ...]


def _scan(source: Path, exclude: Sequence[str], guard: StateGuard, limit: CopyLimit,
          kept: Kept | None = None) -> _Plan:
    """First pass: count, and stop as soon as the limit is passed."""
    files = total = 0
    skipped: list[tuple[str, str]] = []
    for entry in _walk(str(source), exclude, guard, kept):
        if entry.kind == "skip":
            skipped.append((entry.path, entry.why))
        elif entry.kind == "file":
            files += 1
            total += entry.size
            if total > limit.max_bytes:
                raise limit.exceeded(source, total, files)
    return _Plan(files, total, tuple(skipped))


# ------------------------------------------------------------------------ streaming


class _Stopped(Exception):
    """The consumer went away; the producing thread stops."""


class _Sink(io.RawIOBase):
    """The file object tarfile writes to. Writes are gathered into chunks of
    :data:`CHUNK` bytes (a bytearray: tarfile's many 512-byte writes cost no copying of
    what is already gathered); each full chunk goes to the event loop, which writes it to
    ``tar``'s stdin, so at most one chunk is gathered and one in flight."""

    def __init__(
        self, send: Callable[[bytes], Coroutine[Any, Any, None]], stop: threading.Event
    ) -> None:
        super().__init__()
        self._send = send
        self._stop = stop
        self._buf = bytearray()
        self._pos = 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos  # tarfile's "w" mode asks once, for its start offset

    def write(self, data: Buffer) -> int:
        view = memoryview(data)
        self._buf += view
        self._pos += view.nbytes
        if len(self._buf) >= CHUNK:
            self.send_buffered()
        return view.nbytes

    def send_buffered(self) -> None:
        """Hand what is gathered to the event loop (not ``flush``: IOBase calls that from
        ``close`` and ``__del__``, possibly without an event loop)."""
        if self._stop.is_set():
            raise _Stopped
        if self._buf:
            chunk = bytes(self._buf)
            self._buf.clear()
            anyio.from_thread.run(self._send, chunk)


def _produce(
    source: Path,
    exclude: Sequence[str],
    guard: StateGuard,
    limit: CopyLimit,
    sink: _Sink,
    counter: _Counter,
    stop: threading.Event,
    kept: Kept | None = None,
) -> _Plan:
    """In a worker thread: both passes, the archive written to ``sink``. One thread for
    both, and ``tar`` already starting meanwhile: a small copy costs one thread hop."""
    plan = _scan(source, exclude, guard, limit, kept)
    for path, why in plan.skipped:
        log.warning("not copying %s into the sandbox: %s", path, why)
    log.info("copying %s (%s in %d files) into the sandbox", source,
             v.format_size(plan.bytes), plan.files)
    counter.files_total, counter.bytes_total = plan.files, plan.bytes
    # Not ``with``: on failure, closing would write the end of the archive, turning a
    # truncated copy into a valid one. Mode "w", not the stream mode "w|", whose buffer
    # is copied whole on every write; the sink buffers instead.
    tar = tarfile.open(fileobj=sink, mode="w", format=tarfile.PAX_FORMAT)
    # read source files in CHUNK reads, not 16 KiB ones (typeshed lacks the attribute)
    tar.copybufsize = CHUNK  # type: ignore[attr-defined]
    content = 0
    for entry in _walk(str(source), exclude, guard, kept):
        if stop.is_set():
            raise _Stopped
        if entry.kind in ("dir", "link"):
            tar.addfile(_owned(tar.gettarinfo(entry.path, arcname=entry.rel)))
        elif entry.kind == "file":
            content += _add_file(tar, entry)
            counter.files_done += 1
            if content > limit.max_bytes:
                raise limit.exceeded(source, content, counter.files_done)
    tar.close()  # the end-of-archive blocks
    sink.send_buffered()
    return plan


def _add_file(tar: tarfile.TarFile, entry: _Entry) -> int:
    """Archive one regular file, opened without following a symlink (a file swapped for a
    link since the walk is refused). Returns the content bytes added."""
    try:
        fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise TransferError(
            f"cannot read {entry.path}: {exc.strerror}; leave it out with "
            "workspace.source.exclude"
        ) from None
    with os.fdopen(fd, "rb", buffering=0) as f:
        info = _owned(tar.gettarinfo(arcname=entry.rel, fileobj=f))
        if info.isreg():
            tar.addfile(info, f)
            return info.size
        if info.islnk():  # a hard link to a file already archived
            tar.addfile(info)
        return 0  # became a fifo or device since the walk: not copied


def _owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


async def _drain(stream: AsyncIterator[bytes], tail: bytearray | None) -> None:
    async for chunk in stream:
        if tail is not None:
            tail += chunk
            del tail[:-_STDERR_TAIL]


async def copy_dir_into(
    handle: Handle,
    source: Path,
    dest: str = "/workspace",
    *,
    exclude: Sequence[str] = (),
    limit: CopyLimit | None = None,
    progress: ProgressCallback | None = None,
    ignore_files: bool = False,
) -> CopyStats:
    """Copy the contents of host directory ``source`` into ``dest`` in the sandbox.

    ``limit`` caps the file contents copied (default: :meth:`CopyLimit.resolve`); going
    over raises :class:`CopyTooLarge`, before anything is sent when the first pass sees
    it. corral's state inside ``source`` is left out and logged. ``progress`` (default:
    the one set by :func:`report_copy_progress`) gets :class:`CopyProgress` reports. With
    ``ignore_files``, what ``.gitignore`` and ``.corralignore`` files leave out (and
    ``.git``) is not copied (:mod:`corral.sandbox._ignore`).
    The handle's provider must support ``writable_stdin``."""
    source = Path(os.path.realpath(source))
    if not source.is_dir():
        raise TransferError(f"{source} is not a directory on the host")
    limit = limit or CopyLimit.resolve()
    guard = StateGuard.current()
    counter = _Counter(str(source))
    counter.ignore_files = ignore_files
    kept = await anyio.to_thread.run_sync(kept_files, source) if ignore_files else None
    await handle.fs.mkdir(dest, parents=True)
    plan = await _stream(handle, dest, counter, progress or _progress_var.get(),
                         lambda sink, stop: _produce(source, tuple(exclude), guard, limit,
                                                     sink, counter, stop, kept))
    log.info("copied %s into the sandbox in %.1f s", source, time.monotonic() - counter.started)
    return CopyStats(plan.files, plan.bytes, plan.skipped)


async def _stream(
    handle: Handle,
    dest: str,
    counter: _Counter,
    progress: ProgressCallback | None,
    produce: Callable[[_Sink, threading.Event], _Plan],
) -> _Plan:
    """Run ``tar -x`` in the sandbox and feed it what ``produce`` writes, then check it."""
    proc = await handle.process.spawn(list(_TAR_X), cwd=dest)
    stop = threading.Event()
    errors = bytearray()
    broken = False

    async def send(chunk: bytes) -> None:
        await proc.write_stdin(chunk)
        counter.bytes_done += len(chunk)
        now = time.monotonic()
        if progress is not None and now - counter.last_report >= PROGRESS_EVERY:
            counter.last_report = now
            progress(counter.snapshot())

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_drain, proc.stdout, None)
            tg.start_soon(_drain, proc.stderr, errors)
            try:
                # abandon_on_cancel: a cancel (Ctrl-C) returns at once; ``stop`` and the
                # killed tar end the thread at its next write
                plan = await anyio.to_thread.run_sync(produce, _Sink(send, stop), stop,
                                                      abandon_on_cancel=True)
            except (BrokenPipeError, ConnectionResetError):
                broken = True  # tar stopped reading: its exit status says why
            finally:
                stop.set()  # a cancelled wait leaves the thread running: make it stop
                with anyio.CancelScope(shield=True):
                    await proc.close_stdin()
            result = await proc.wait()
    except BaseException as exc:
        with anyio.CancelScope(shield=True):
            await proc.kill()
        if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            raise exc.exceptions[0] from None  # one failure: raise it as such
        raise
    if not result.ok or broken:
        err = errors.decode("utf-8", "replace").strip()[-1000:]
        raise TransferError(
            f"unpacking {counter.source} into {dest} failed ({result.describe()}): {err}"
        )
    if progress is not None:
        progress(counter.snapshot(done=True))
    return plan

