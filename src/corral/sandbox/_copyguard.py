"""What a copy of a host directory into a sandbox must never take.

* System directories (``/``, ``/proc``, ``/usr``, ``/etc``, …) are refused as a workspace:
  copying them hands the host to the agent, and the pseudo filesystems never end.
* corral's own state is never copied, wherever it sits in the workspace: the current
  ``$CORRAL_HOME``, any directory that is or looks like one (corral writes
  :data:`~corral._paths.HOME_MARKER` into every home it uses; older homes are recognized by
  ``corral.db`` next to ``sandboxes/`` or ``journals/``), the SQLite store file and its
  sidecars, sandbox state directories and journal directories. They hold other runs'
  nonces, journals and secrets; an agent that could read them could forge exit sentinels.
* A workspace inside corral's state is refused.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from corral._errors import ConfigError
from corral._paths import HOME_MARKER, SHARED_ROOT, corral_home

__all__ = ["StateGuard", "refuse_system_dir"]

_SYSTEM_DIRS = frozenset({
    "/", "/bin", "/boot", "/dev", "/etc", "/home", "/lost+found", "/media", "/mnt", "/opt",
    "/proc", "/run", "/sbin", "/snap", "/srv", "/sys", "/tmp", "/usr", "/usr/bin",
    "/usr/include", "/usr/local", "/usr/sbin", "/usr/share", "/var", "/var/cache", "/var/lib",
    "/var/log", "/var/tmp", "/var/spool", "/var/mail",
})  # fmt: skip
_LIB_RE = re.compile(r"^/(usr/)?lib[^/]*$")  # /lib, /lib64, /usr/libx32, …
# Pseudo and runtime filesystems: nothing under them is a project.
_PSEUDO_ROOTS = ("/proc", "/sys", "/dev", "/run")

_STORE_NAME = "corral.db"
_STORE_SIDECARS = ("", "-wal", "-shm", "-journal", ".notify")


def refuse_system_dir(path: str, field: str = "workspace.source.path") -> None:
    """Raise :class:`ConfigError` when ``path`` (absolute, resolved) is a system directory."""
    if not _is_system_dir(path):
        return
    what = "the whole host" if path == "/" else "not a project"
    raise ConfigError(
        f"{field}: {path!r} is a system directory ({what}); corral will not copy it into a "
        "sandbox: pass your project's directory instead"
    )


def _is_system_dir(path: str) -> bool:
    if path in _SYSTEM_DIRS or _LIB_RE.match(path):
        return True
    return any(path.startswith(root + "/") for root in _PSEUDO_ROOTS)


@dataclass(frozen=True, slots=True)
class StateGuard:
    """corral's state as found from this process's environment, and the signs that mark
    state of other homes. Paths are absolute and resolved."""

    roots: tuple[str, ...]
    """Directories that are corral's state: the current ``$CORRAL_HOME`` and the shared
    root (other sandboxes' files and sockets when running as root)."""
    store: str | None
    """The SQLite store file in use (its sidecars share its name as a prefix)."""

    @classmethod
    def current(cls, environ: Mapping[str, str] | None = None) -> StateGuard:
        """The guard for the state this process uses (``$CORRAL_HOME``, ``$CORRAL_STORE``,
        ``$CORRAL_BWRAP_FILES``, the shared root)."""
        env = os.environ if environ is None else environ
        home = corral_home(create=False)
        # The bubblewrap provider keeps root-mode sandboxes' files here (read from the
        # environment: the sandbox layer does not import providers).
        files = env.get("CORRAL_BWRAP_FILES", str(SHARED_ROOT / "bubblewrap"))
        roots = tuple(dict.fromkeys(_real(p) for p in (home, SHARED_ROOT, Path(files))))
        return cls(roots=roots, store=_store_file(env.get("CORRAL_STORE"), home))

    def refuse_source(self, source: str, field: str = "workspace.source.path") -> None:
        """Raise :class:`ConfigError` when ``source`` is inside corral's state."""
        for root in self.roots:
            if source == root or source.startswith(root + "/"):
                raise ConfigError(
                    f"{field}: {source!r} is inside corral's own state ({root}); corral never "
                    "copies its state into a sandbox: pass your project's directory instead"
                )
        # Only the marker counts here: the looser signs used for skipping (a corral.db
        # next to journals/) are too weak to refuse a directory that merely sits beside
        # such files.
        for parent in (source, *map(str, Path(source).parents)):
            if os.path.isfile(os.path.join(parent, HOME_MARKER)):
                raise ConfigError(
                    f"{field}: {source!r} is inside corral's own state ({parent} is a "
                    "CORRAL_HOME); corral never copies its state into a sandbox: pass your "
                    "project's directory instead"
                )

    def skip_dir(self, path: str, names: Collection[str]) -> str | None:
        """Why directory ``path`` (holding ``names``) must not be copied, or ``None``."""
        if path in self.roots:
            return "it is corral's state directory in use"
        if HOME_MARKER in names:
            return f"it is a CORRAL_HOME (it holds {HOME_MARKER})"
        if _STORE_NAME in names and ("sandboxes" in names or "journals" in names):
            return "it looks like a CORRAL_HOME (corral.db with sandboxes/ or journals/)"
        # A local sandbox makes private/ and root/ on first use: either one marks it, with
        # its state (a file, or the directory's attribute).
        if ("private" in names or "root" in names) and (
                "state.json" in names or _has_state_attribute(path)):
            return "it looks like a corral sandbox's state directory"
        if any(n.endswith(".journal") and n[:-8] + ".status.json" in names for n in names):
            return "it looks like a corral journal directory"
        return self.skip_file(path, os.path.basename(path))  # the store's .notify directory

    def skip_file(self, path: str, name: str) -> str | None:
        """Why file ``path`` (named ``name``) must not be copied, or ``None``. The store's
        sidecars (``-wal``, ``-shm``, the ``.notify`` directory) share its name."""
        if self.store is not None:
            directory, base = os.path.split(self.store)
            if os.path.dirname(path) == directory and name.startswith(base):
                return "it is corral's run store in use"
        if any(name == _STORE_NAME + s for s in _STORE_SIDECARS):
            return "it looks like a corral run store"
        return None


_STATE_XATTR = "user.corral.state"  # corral.providers._state.STATE_XATTR (a higher layer)


def _has_state_attribute(path: str) -> bool:
    try:
        os.getxattr(path, _STATE_XATTR, follow_symlinks=False)
    except OSError:
        return False
    return True


def _real(path: Path) -> str:
    return os.path.realpath(path.expanduser())


def _store_file(url: str | None, home: Path) -> str | None:
    """The SQLite file behind the store URL (the rules of :func:`corral.stores.open_store`)."""
    if not url:
        return _real(home / _STORE_NAME)
    scheme, sep, rest = url.partition("://")
    if scheme != "sqlite" or not sep:
        return None
    rest = rest.partition("?")[0]
    if rest.startswith("//"):
        rest = rest[1:]
    return _real(Path(rest)) if rest else None
