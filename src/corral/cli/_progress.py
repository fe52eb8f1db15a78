"""Progress of long operations on a terminal (stderr), one line rewritten in place."""

from __future__ import annotations

from typing import TextIO

from corral.sandbox._transfer import CopyProgress
from corral.sandbox._validate import format_size

__all__ = ["CopyProgressLine"]


class CopyProgressLine:
    """A :data:`~corral.sandbox._transfer.ProgressCallback` that draws the workspace copy
    as one updating line on a terminal. Quick copies (under ``delay`` seconds) print
    nothing; a line that was drawn ends with a summary."""

    def __init__(self, out: TextIO, delay: float = 0.5) -> None:
        self._out = out
        self._delay = delay
        self._shown = False

    def __call__(self, p: CopyProgress) -> None:
        if p.done:
            if self._shown:
                self._draw(f"copied the workspace: {format_size(p.bytes_total)} in "
                           f"{p.files_total} files, {p.elapsed:.1f} s\n")
            return
        if p.elapsed < self._delay:
            return
        pct = 100 * p.bytes_done // p.bytes_total if p.bytes_total else 100
        self._draw(f"copying the workspace: {format_size(p.bytes_done)} of "
                   f"{format_size(p.bytes_total)} ({pct}%), {p.files_done} of "
                   f"{p.files_total} files")
        self._shown = True

    def _draw(self, text: str) -> None:
        # \r + erase-line: redraw in place
        self._out.write(f"\r\x1b[Kcorral: {text}")
        self._out.flush()
