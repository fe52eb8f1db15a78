"""Reading a run's journal on the host: by byte offset, following, and probing its tail.

The journal is ``agent_stdout + b"\\n" + SENTINEL + b"\\n"`` (see
:mod:`corral.journal._sentinel`), possibly followed by bytes a straggler wrote after the agent
exited, which are ignored. The reader splits it at ``\\n`` into **segments**:

- every segment before the sentinel is a :class:`Line`; ``data`` excludes the newline;
- ``b"\\n".join(line.data for line in lines) == agent_stdout``, exactly, for any bytes
  (no final newline, invalid UTF-8, 20 MB lines, empty output = one empty line);
- a Line is yielded only once its terminating ``\\n`` is in the file; the agent's final
  unterminated line is terminated by the supervisor's separator, which is written together
  with the sentinel after the agent exited, so no partial line is ever yielded;
- a line that starts at offset ``s > 0`` is preceded by a newline in the agent's output, so a
  consumer that wants the text reproduces it as ``"\\n" + data`` (first line: ``data``); the
  newline of the last line is thus only shown when the next line (or the end) arrives, while
  visible content is never delayed;
- :class:`Exit` comes last, once the exact-nonce sentinel is read; the reader then stops,
  even if more bytes follow.

Offsets are absolute byte positions. ``Line.end_offset`` / ``Exit.end_offset`` are where a
successor resumes (``after=``); resuming elsewhere than ``0`` or just past a newline is
refused. Reading from an offset seeks; cost does not depend on what lies before it.

Reads are plain blocking reads of a local (page-cached) file done on the event loop thread in
chunks of at most ``chunk_size`` with a checkpoint between chunks.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

import anyio
import anyio.lowlevel

from corral._errors import CorralError
from corral.journal._inotify import FileWatch
from corral.journal._layout import JournalPaths, read_status
from corral.journal._sentinel import SentinelExit, normalize_nonce, parse_sentinel
from corral.journal._supervisor import is_ours

__all__ = [
    "Exit",
    "JournalAbandonedError",
    "JournalError",
    "JournalItem",
    "JournalTamperedError",
    "Line",
    "Opener",
    "Probe",
    "probe_journal_tail",
    "read_journal",
    "read_stderr_tail",
]

Opener = Callable[[Path], BinaryIO]
"""Opens a file for binary reading; injectable so tests can count the bytes read."""

DEFAULT_CHUNK = 1 << 20
DEFAULT_MAX_LINE = 256 << 20
STDERR_TAIL_BYTES = 4096


class JournalError(CorralError):
    """The journal cannot be read as asked (bad offset, oversized line, unreadable file)."""


class JournalAbandonedError(JournalError):
    """The supervisor is gone and the journal has no exit sentinel: the run's end is lost."""


@dataclass(frozen=True, slots=True)
class Line:
    """One ``\\n``-separated segment of the agent's stdout (newline not included)."""

    data: bytes
    end_offset: int
    """Absolute offset just past this segment's terminating newline: resume point."""

    @property
    def start_offset(self) -> int:
        return self.end_offset - len(self.data) - 1


@dataclass(frozen=True, slots=True)
class Exit:
    """The agent exited: ``code`` (``128 + N`` for signal ``N``), ``signal`` or ``None``."""

    code: int
    signal: int | None
    end_offset: int
    """Offset just past the sentinel line."""
    stderr_tail: bytes = b""
    """The last bytes of the stderr sidecar (when the reader was given :class:`JournalPaths`)."""


JournalItem = Line | Exit


def default_open(path: Path) -> BinaryIO:
    """Open a journal file for reading, unbuffered (followers read at exact offsets)."""
    return open(path, "rb", buffering=0)


def read_stderr_tail(
    path: Path, max_bytes: int = STDERR_TAIL_BYTES, *, opener: Opener = default_open
) -> bytes:
    """The last ``max_bytes`` of a file (the stderr sidecar); ``b""`` if unreadable."""
    try:
        with opener(path) as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - max_bytes))
            return f.read(max_bytes) or b""
    except OSError:
        return b""


def _split(target: JournalPaths | str | os.PathLike[str]) -> tuple[Path, JournalPaths | None]:
    if isinstance(target, JournalPaths):
        return target.journal, target
    return Path(target), None


async def read_journal(
    target: JournalPaths | str | os.PathLike[str],
    *,
    after: int = 0,
    nonce: str | bytes | None,
    follow: bool = True,
    poll: float = 0.05,
    opener: Opener = default_open,
    chunk_size: int = DEFAULT_CHUNK,
    max_line_bytes: int = DEFAULT_MAX_LINE,
    liveness_interval: float = 1.0,
) -> AsyncGenerator[JournalItem, None]:
    """Yield the journal's lines after byte ``after``, then its :class:`Exit`.

    ``nonce``: this run's nonce; ``None`` reads lines only (no sentinel is recognised).
    ``follow``: wait for more bytes at the end (woken by inotify on Linux, re-checking at
    least every ``max(poll, liveness_interval)`` seconds; without inotify, polling with sleeps
    that start at 2 ms and grow to ``poll`` seconds while idle); otherwise stop at the current end of the file
    (without an :class:`Exit` unless the sentinel was there; never yielding a partial line).
    With a :class:`JournalPaths` target, :class:`Exit` carries the stderr tail and a follower
    that sees no growth for ``liveness_interval`` checks the supervisor: if it is gone and no
    sentinel arrived, :class:`JournalAbandonedError` is raised instead of waiting forever.
    Stop early by breaking out and calling ``aclose()`` or by cancelling the task.
    """
    _check_options(after, poll, chunk_size, max_line_bytes)
    key = normalize_nonce(nonce) if nonce is not None else None
    path, paths = _split(target)

    f = await _open_waiting(path, opener, follow, poll)
    if f is None:
        return
    # Registered before the first read, so no write between a read and a wait is missed.
    watch = FileWatch.open(path) if follow else None
    try:
        _seek_line_boundary(f, path, after)
        base = after  # absolute offset of buf[0]
        buf = bytearray()
        scan = 0  # buf[:scan] is known to hold no newline past the consumed part
        idle = _Idle(poll, liveness_interval)
        while True:
            chunk = f.read(chunk_size)
            if chunk:
                idle.reset()
                buf += chunk
                start = 0
                while True:
                    nl = buf.find(b"\n", max(start, scan))
                    if nl < 0:
                        break
                    seg = memoryview(buf)[start:nl]
                    end = base + nl + 1
                    hit: SentinelExit | None = parse_sentinel(seg, key) if key else None
                    if hit is not None:
                        seg.release()
                        tail = read_stderr_tail(paths.stderr, opener=opener) if paths else b""
                        yield Exit(hit.code, hit.signal, end, tail)
                        return
                    data = bytes(seg)
                    seg.release()
                    start = nl + 1
                    yield Line(data, end)
                del buf[:start]
                base += start
                scan = len(buf)
                _check_line_length(path, base, len(buf), max_line_bytes)
                await anyio.lowlevel.checkpoint()
                continue
            _check_unchanged(f, path, base, len(buf))
            if not follow:
                return
            if paths is not None and idle.check_liveness() and _supervisor_gone(paths):
                _abandoned_unless_grown(f, path, base, base + len(buf))
                continue
            await idle.wait(watch)
    finally:
        f.close()
        if watch is not None:
            watch.close()


def _check_options(after: int, poll: float, chunk_size: int, max_line_bytes: int) -> None:
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise JournalError(f"journal offset must be a non-negative integer, got {after!r}")
    if poll <= 0 or chunk_size <= 0 or max_line_bytes <= 0:
        raise JournalError("poll, chunk_size and max_line_bytes must be positive")


def _check_line_length(path: Path, base: int, unfinished: int, max_line_bytes: int) -> None:
    """``unfinished`` bytes at ``base`` hold no newline yet: refuse past the limit."""
    if unfinished > max_line_bytes:
        raise JournalError(
            f"journal {path} has a line longer than {max_line_bytes} bytes at "
            f"offset {base}; raise max_line_bytes to read it"
        )


def _seek_line_boundary(f: BinaryIO, path: Path, after: int) -> None:
    """Put ``f`` at ``after``, which must start a line."""
    if after > 0:
        f.seek(after - 1)
        if f.read(1) != b"\n":
            raise JournalError(
                f"journal offset {after} of {path} is not at a line boundary; resume only "
                "from 0 or from an end_offset the reader yielded"
            )


def _abandoned_unless_grown(f: BinaryIO, path: Path, base: int, read_to: int) -> None:
    """The supervisor is gone: one more look at the end (the sentinel may have landed just
    before it exited); raise :class:`JournalAbandonedError` when nothing came, else put
    ``f`` back where reading goes on."""
    if f.seek(0, os.SEEK_END) == read_to:
        raise JournalAbandonedError(
            f"the supervisor of journal {path} is gone and the journal has no "
            "exit sentinel after offset "
            f"{base}; the agent's exit status is lost (its output is kept)"
        )
    f.seek(read_to)


class _Idle:
    """A follower at the end of the journal: how long it waits for more, and when it is
    time to check that the supervisor is still there."""

    def __init__(self, poll: float, liveness_interval: float) -> None:
        self.poll = poll
        self.liveness_interval = liveness_interval
        self.reset()

    def reset(self) -> None:
        """The journal grew."""
        self.sleep = 0.002
        self.since = time.monotonic()

    def check_liveness(self) -> bool:
        """Whether the journal has been still for ``liveness_interval`` (once per interval)."""
        if time.monotonic() - self.since < self.liveness_interval:
            return False
        self.since = time.monotonic()
        return True

    async def wait(self, watch: FileWatch | None) -> None:
        """Until the file may have grown: inotify's word, or a sleep growing to ``poll``."""
        if watch is not None:
            await watch.wait(max(self.poll, self.liveness_interval))
        else:
            await anyio.sleep(self.sleep)
            self.sleep = min(self.sleep * 2, self.poll)


class JournalTamperedError(JournalError):
    """The journal shrank or changed under an offset already read: only its supervisor
    appends to it, so something else wrote it and the run's output cannot be trusted."""


def _check_unchanged(f: BinaryIO, path: Path, base: int, pending: int) -> None:
    """At the end of the file: it must still reach what was read, and the byte before
    ``base`` (the newline that ended the last line yielded) must still be one."""
    read_to = base + pending
    size = f.seek(0, os.SEEK_END)
    intact = size >= read_to
    if intact and base > 0:
        f.seek(base - 1)
        intact = f.read(1) == b"\n"
    if not intact:
        raise JournalTamperedError(
            f"journal {path} changed under the reader: it is {size} bytes, {read_to} were "
            "already read; something other than the run's supervisor truncated or rewrote it, "
            "so the run's output and exit cannot be trusted"
        )
    f.seek(read_to)


def _supervisor_gone(paths: JournalPaths) -> bool:
    st = read_status(paths.status)
    if st is None:
        # Not started yet (or not supervised here: a mirror of a journal kept in the
        # sandbox), so cannot tell and keep following; unless the driver noted that the
        # sandbox holding the supervisor is gone (nothing more can come).
        return _noted_gone(paths)
    return not is_ours(st.supervisor_pid, st.supervisor_start)


def _noted_gone(paths: JournalPaths) -> bool:
    try:
        return bool(json.loads(paths.agent_state.read_bytes()).get("state") == "gone")
    except (OSError, ValueError, AttributeError):
        return False


async def _open_waiting(path: Path, opener: Opener, follow: bool, poll: float) -> BinaryIO | None:
    sleep = 0.002
    while True:
        try:
            return opener(path)
        except FileNotFoundError:
            if not follow:
                return None
        except OSError as exc:
            raise JournalError(f"cannot read journal {path}: {exc.strerror or exc}") from exc
        await anyio.sleep(sleep)
        sleep = min(sleep * 2, poll)


# ---------------------------------------------------------------- tail probe


@dataclass(frozen=True, slots=True)
class Probe:
    """The reaper's view of a journal, obtained without driving the run.

    ``finished``: the exact-nonce sentinel is there (``code``/``signal`` set).
    ``producing``: no sentinel yet, and the supervisor is alive or the file changed within
    ``recent`` seconds. ``unknown``: no sentinel and no sign of life, or the probe failed
    (``reason`` says which). Never ``finished`` on a failure.
    """

    state: Literal["finished", "producing", "unknown"]
    code: int | None = None
    signal: int | None = None
    reason: str = ""


def _first_sentinel(window: bytes, key: bytes, starts_at_line: bool) -> SentinelExit | None:
    parts = window.split(b"\n")
    # parts[-1] is unterminated (never a sentinel: the trailer ends with "\n"); parts[0] may
    # be cut by the window start. The *first* valid sentinel wins: nothing can forge one
    # before the real one exists, while a straggler that read the journal afterwards could
    # append a copy with another code.
    for part in parts[0 if starts_at_line else 1 : -1]:
        hit = parse_sentinel(part, key)
        if hit is not None:
            return hit
    return None


def probe_journal_tail(
    target: JournalPaths | str | os.PathLike[str],
    nonce: str | bytes,
    *,
    max_bytes: int = 65536,
    recent: float = 30.0,
    max_scan: int = 64 << 20,
    opener: Opener = default_open,
    now: float | None = None,
) -> Probe:
    """Classify a journal by reading only its end; never drives the run, never raises.

    With :class:`JournalPaths` and a status file that records the agent's exit, the scan
    starts at the recorded trailer position (normally a ~100-byte read; at most ``max_scan``
    bytes when a straggler wrote after the sentinel). Otherwise it reads the last
    ``max_bytes``. Liveness for ``producing``: the supervisor (pid + start time) or a journal
    modified within ``recent`` seconds.
    """
    try:
        key = normalize_nonce(nonce)
        path, paths = _split(target)
        status = read_status(paths.status) if paths else None
        try:
            f = opener(path)
        except FileNotFoundError:
            f = None
        if f is not None:
            with f:
                size = f.seek(0, os.SEEK_END)
                hint = status.trailer_hint if status and status.state == "exited" else None
                if hint is not None and 0 <= hint <= size:
                    # The trailer starts at hint with its separator, i.e. at a line start.
                    f.seek(hint)
                    window = f.read(min(max_bytes, size - hint))
                    hit = _first_sentinel(window, key, True)
                    if hit is None and hint + len(window) < size:  # stragglers wrote a lot
                        window += f.read(min(max_scan, size - hint) - len(window))
                        hit = _first_sentinel(window, key, True)
                else:
                    lo = max(0, size - max_bytes)
                    f.seek(lo)
                    hit = _first_sentinel(f.read(size - lo), key, lo == 0)
                if hit is not None:
                    return Probe("finished", hit.code, hit.signal)
        if status is not None and is_ours(status.supervisor_pid, status.supervisor_start):
            return Probe("producing", reason="no exit sentinel yet; the supervisor is alive")
        try:
            mtime = path.stat().st_mtime
        except FileNotFoundError:
            return Probe("unknown", reason=f"journal {path} does not exist")
        current = time.time() if now is None else now
        if current - mtime <= recent:
            return Probe("producing", reason="no exit sentinel yet; the journal grew recently")
        return Probe(
            "unknown",
            reason=f"journal {path} has no exit sentinel, no live supervisor, and has not "
            f"changed for {current - mtime:.0f}s",
        )
    except Exception as exc:  # noqa: BLE001 - a probe never raises; failure is "unknown"
        return Probe("unknown", reason=f"probe failed: {exc!r}")
