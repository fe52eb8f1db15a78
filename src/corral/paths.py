"""Where corral keeps its state on the host."""

from __future__ import annotations

import os
from pathlib import Path


HOME_MARKER = ".corral-home"
"""A file corral writes into every ``$CORRAL_HOME`` it uses, so that a copy of a host
directory can tell corral's state apart from the user's files and leave it out."""

_marked: set[Path] = set()


def corral_home(*, create: bool = True) -> Path:
    """``$CORRAL_HOME``, default ``~/.corral``. Created on first use (mode 0700) and marked
    with :data:`HOME_MARKER`; ``create=False`` only names it."""
    raw = os.environ.get("CORRAL_HOME")
    home = Path(raw).expanduser() if raw else Path.home() / ".corral"
    if create:
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        _mark(home)
    return home


def _mark(home: Path) -> None:
    # Once per process and home: this is on hot paths, and homes made by older versions
    # get their marker the first time a new version uses them.
    if home in _marked:
        return
    marker = home / HOME_MARKER
    if not marker.exists():
        try:
            marker.write_text("This directory is corral's state ($CORRAL_HOME). corral never "
                              "copies it into a sandbox.\n")
        except OSError:
            return  # a read-only home still works; the other signs still identify it
    _marked.add(home)


SHARED_ROOT = Path(os.environ.get("CORRAL_SHARED_DIR", "/var/lib/corral"))
"""Host state shared with sandboxes' unprivileged uid when corral runs as root."""


def net_root(*, create: bool = True) -> Path:
    """Parent of per-sandbox socket directories (each bound at ``/run/corral`` in its
    sandbox). Running as root it must be reachable by the sandboxes' unprivileged host
    uid, so it is under :data:`SHARED_ROOT`; otherwise under ``$CORRAL_HOME``."""
    if os.geteuid() == 0:
        base = SHARED_ROOT / "net"
        if create:
            for d in (SHARED_ROOT, base):
                d.mkdir(mode=0o711, exist_ok=True)
        return base
    base = corral_home() / "net"
    if create:
        base.mkdir(mode=0o700, exist_ok=True)
    return base
