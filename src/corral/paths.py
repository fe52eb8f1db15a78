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
