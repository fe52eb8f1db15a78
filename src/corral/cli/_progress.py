"""Progress of the workspace copy on stderr: one line saying what is copied and how big,
then, on a terminal, a line redrawn in place while it goes."""

from __future__ import annotations

from typing import TextIO

from corral.sandbox._transfer import CopyProgress
from corral._validate import format_size

__all__ = ["CopyProgressLine"]


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
