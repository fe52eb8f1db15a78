"""Progress of a long step on stderr: the workspace copy of ``corral run``
(:class:`CopyProgressLine`) and the stages of ``corral agents install`` and ``corral images
build`` (:class:`Stages`).

The copy: one line saying what is copied and how big, then, on a terminal, a line redrawn in
place while it goes. The stages: on a terminal, a line per stage drawn by rich, the current
one with a spinner and its elapsed time ticking, the finished ones with theirs; elsewhere (a
log, a pipe), one plain line per finished stage, ``corral: TITLE: STAGE (N s)``. rich is
imported only when a terminal asks for it.
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import TYPE_CHECKING, Any, TextIO

from corral._validate import format_size

if TYPE_CHECKING:
    from corral.sandbox._transfer import CopyProgress

__all__ = ["CopyProgressLine", "Stages"]


class CopyProgressLine:
    """A :data:`~corral.sandbox._transfer.ProgressCallback`: ``corral: copying DIR (SIZE in
    N files, .gitignore honoured)`` once per copy, then with ``bar`` (a terminal) a progress
    line redrawn in place after ``delay`` seconds, ended by a summary line."""

    def __init__(self, out: TextIO, delay: float = 0.5, *, bar: bool = True) -> None:
        self._out = out
        self._delay = delay
        self._bar = bar
        self._announced: set[str] = set()
        self._shown = False

    def __call__(self, p: CopyProgress) -> None:
        if p.source not in self._announced and (p.files_total or p.done):
            self._announced.add(p.source)
            how = ("; .gitignore and .corralignore honoured, --no-ignore copies everything"
                   if p.ignore_files else "")
            self._out.write(f"corral: copying {p.source} into the sandbox "
                            f"({format_size(p.bytes_total)} in {p.files_total} files{how})\n")
            self._out.flush()
        if not self._bar:
            return
        if p.done:
            if self._shown:
                self._draw(f"copied the workspace: {format_size(p.bytes_total)} in "
                           f"{p.files_total} files, {p.elapsed:.1f} s\n")
                self._shown = False
            return
        if p.elapsed < self._delay:
            return
        pct = 100 * p.bytes_done // p.bytes_total if p.bytes_total else 100
        filled = pct * 20 // 100
        self._draw(f"copying the workspace: [{'#' * filled}{'.' * (20 - filled)}] "
                   f"{format_size(p.bytes_done)} of {format_size(p.bytes_total)} ({pct}%), "
                   f"{p.files_done} of {p.files_total} files")
        self._shown = True

    def _draw(self, text: str) -> None:
        # \r + erase-line: redraw in place
        self._out.write(f"\r\x1b[Kcorral: {text}")
        self._out.flush()


class Stages:
    """A context manager: :meth:`stage` ends the current stage and starts the next; leaving
    ends the last one (a failed one is not reported as finished)."""

    def __init__(self, title: str, out: TextIO, *, terminal: bool | None = None) -> None:
        self._title = title
        self._out = out
        self._terminal = out.isatty() if terminal is None else terminal
        self._current: str | None = None
        self._started = 0.0
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> Stages:
        if self._terminal:
            from rich.console import Console
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                SpinnerColumn(finished_text="[green]✓"),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=Console(file=self._out),
                refresh_per_second=4,
            )
            self._progress.start()
        return self

    def stage(self, name: str) -> None:
        """Start stage ``name`` (the previous one is finished)."""
        self._finish()
        self._current, self._started = name, time.monotonic()
        if self._progress is not None:
            self._task = self._progress.add_task(f"corral: {self._title}: {name}", total=1)

    def _finish(self) -> None:
        if self._current is None:
            return
        if self._progress is not None:
            self._progress.update(self._task, completed=1)
        else:
            took = time.monotonic() - self._started
            self._out.write(f"corral: {self._title}: {self._current} ({took:.0f} s)\n")
            self._out.flush()
        self._current = None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if kind is None:
            self._finish()
        if self._progress is not None:
            self._progress.stop()
