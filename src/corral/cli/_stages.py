"""Stages of a long command (``corral agents install``, ``corral images build``) on stderr.

On a terminal: a line per stage drawn by rich, the current one with a spinner and its
elapsed time ticking, the finished ones with theirs. Elsewhere (a log, a pipe): one plain
line per finished stage, ``corral: TITLE: STAGE (N s)``. rich is imported here only, when a
terminal asks for it, so other commands (``corral --version``) never load it.
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any, TextIO

__all__ = ["Stages"]


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
