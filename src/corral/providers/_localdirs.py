"""The local provider's directories, made when first used and deleted without a walk.

A local sandbox starts as an empty ``<id>/`` whose state is in its ``user.corral.state``
attribute (``state.json`` in it where the filesystem keeps no such attributes): ``create``
is one ``mkdir`` and one ``setxattr``. Its writable areas (``root/workspace``, ``root/tmp``,
``root/home/agent``) are made by the first launch or file operation that needs them, and
``private/`` by the first use of the handle's private directory; any process may make
them (``mkdir`` that tolerates a racing maker).

``destroy`` moves the directory aside (it disappears atomically), deletes every file in
it, and checks that only the empty, fixed-name directories create or first use makes are
left (a few ``listdir`` calls). Those are removed by the background grave digger
(``_state.delete_later``): on a disk where an ``rmdir`` costs ~0.1 ms they were most of
destroy's time, and an empty directory with a name corral chose holds nothing the agent
wrote. Anything else in the grave (a file, a directory the agent made) is deleted before
``destroy`` returns: it may hold a secret.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from corral.providers._state import delete_later

__all__ = ["clear_grave", "make_areas", "make_private"]

# (directory relative to the sandbox dir, mode), parents first; the workspace right after
# root: resume takes a root without it for a sandbox whose files were wiped.
_AREAS = (("root", 0o755), ("root/workspace", 0o755), ("root/tmp", 0o1777),
          ("root/home", 0o755), ("root/home/agent", 0o755))
# What an unused grave may still hold once its files are unlinked: dir -> allowed children.
_SKELETON = {
    "": ("root", "private"),
    "root": ("workspace", "tmp", "home"),
    "root/home": ("agent",),
}
_STATE_FILES = ("state.json", "state.destroying.json")


def make_areas(sandbox_dir: Path | str) -> None:
    """Make the missing writable areas under ``sandbox_dir/root``. Raises
    FileNotFoundError when ``sandbox_dir`` itself is gone (destroyed)."""
    base = str(sandbox_dir)
    for rel, mode in _AREAS:
        where = f"{base}/{rel}"
        try:
            os.mkdir(where, mode)
        except FileExistsError:
            continue
        if mode == 0o1777:
            os.chmod(where, mode)  # mkdir's mode passes through the umask


def make_private(sandbox_dir: Path | str) -> None:
    """Make ``sandbox_dir/private`` (host-only files) if it is missing."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(f"{sandbox_dir}/private", 0o700)


def clear_grave(grave: Path, *, destroying: bool = False) -> bool:
    """Unlink the state file(s) of a buried sandbox (``destroying``: it may hold
    ``state.destroying.json``); when only the empty skeleton is left, hand its directories
    to the background digger and return True. False: the grave holds something else (the
    caller deletes it all before it returns)."""
    g = str(grave)
    for name in _STATE_FILES if destroying else _STATE_FILES[:1]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{g}/{name}")
    try:
        with os.scandir(g) as it:
            top = list(it)
        if not top:  # never used: one rmdir, no thread
            os.rmdir(g)
            return True
        if not _skeleton(g, "", top):
            return False
    except (FileNotFoundError, NotADirectoryError):
        return False
    delete_later(grave)
    return True


def _skeleton(g: str, rel: str, entries: list[os.DirEntry[str]]) -> bool:
    """Whether ``entries`` (of ``g/rel``) are only the empty directories corral made, by
    name and type (``d_type``: no extra syscall); a file or link by such a name is the
    agent's."""
    allowed = _SKELETON.get(rel, ())
    for entry in entries:
        if entry.name not in allowed or not entry.is_dir(follow_symlinks=False):
            return False
        sub = f"{rel}/{entry.name}" if rel else entry.name
        with os.scandir(f"{g}/{sub}") as it:
            if not _skeleton(g, sub, list(it)):
                return False
    return True
