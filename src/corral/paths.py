"""Where corral keeps its state on the host."""

from __future__ import annotations

import os
from pathlib import Path


def corral_home() -> Path:
    """``$CORRAL_HOME``, default ``~/.corral``. Created on first use (mode 0700)."""
    raw = os.environ.get("CORRAL_HOME")
    home = Path(raw).expanduser() if raw else Path.home() / ".corral"
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    return home


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
