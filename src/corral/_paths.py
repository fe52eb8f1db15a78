"""Where corral keeps its state on the host, and what to say when it cannot be written."""

from __future__ import annotations

import errno
import os
from pathlib import Path

__all__ = [
    "SHARED_ROOT",
    "apply_socket_access",
    "corral_home",
    "describe_os_error",
    "home_label",
    "home_path",
    "net_root",
    "restrict_net_dir",
    "socket_access",
    "storage_problem",
]


def home_path() -> Path:
    """``$CORRAL_HOME``, default ``~/.corral``, without creating it."""
    raw = os.environ.get("CORRAL_HOME")
    return Path(raw).expanduser() if raw else Path.home() / ".corral"


def home_label(home: Path | None = None) -> str:
    """A label naming a ``$CORRAL_HOME`` (a digest of its resolved path): sandboxes made
    with no store (``corral exec --keep``) carry it as ``corral.home``, so that ``corral
    sandboxes`` can tell this home's from another's on a shared Docker daemon."""
    import hashlib  # start-up cost: it loads OpenSSL, which `corral --version` and `ls` skip

    path = str((home or home_path()).expanduser().resolve())
    return hashlib.sha256(path.encode()).hexdigest()[:16]


HOME_MARKER = ".corral-home"
"""A file corral writes into every ``$CORRAL_HOME`` it uses, so that a copy of a host
directory can tell corral's state apart from the user's files and leave it out."""

_marked: set[Path] = set()


def corral_home(*, create: bool = True) -> Path:
    """``$CORRAL_HOME``, default ``~/.corral``. Created on first use (mode 0700) and marked
    with :data:`HOME_MARKER`; ``create=False`` only names it (as :func:`home_path`)."""
    home = home_path()
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


_FULL = (errno.ENOSPC, errno.EDQUOT)


def storage_problem(path: str | os.PathLike[str]) -> str | None:
    """``"read-only"`` or ``"full"`` when the file system holding ``path`` (or its nearest
    existing parent) cannot take writes for that reason, else ``None``."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        st = os.statvfs(p)
    except OSError:
        return None
    if st.f_flag & os.ST_RDONLY:
        return "read-only"
    # A file system that keeps no block or inode count (btrfs has no inode limit, procfs
    # and many FUSE file systems report zeros) is not full: its zeros mean "not counted".
    if (st.f_blocks > 0 and st.f_bavail == 0) or (st.f_files > 0 and st.f_favail == 0):
        return "full"
    return None


def describe_os_error(exc: OSError) -> str:
    """One line for a failed host file operation: the path, what is wrong and the fix.

    A write that fails for lack of space carries no file name, so then corral's own state
    directories (``$CORRAL_HOME``, :data:`SHARED_ROOT`) are checked for a full or read-only
    file system, and the one that is gets named."""
    where = os.fsdecode(exc.filename) if exc.filename is not None else None
    denied = exc.errno in (errno.EACCES, errno.EPERM)
    # permission denied is that, whatever the file system's counts say
    problem = storage_problem(where) if where and not denied else None
    if where is None and not denied:
        for candidate in (home_path(), SHARED_ROOT):
            problem = storage_problem(candidate)
            if problem is not None:
                where = str(candidate)
                break
    if exc.errno == errno.EROFS:
        problem = "read-only"
    elif exc.errno in _FULL:
        problem = "full"
    label = where or "a file corral needed"
    home = str(home_path())
    var = ("CORRAL_HOME" if where is not None and (where == home or where.startswith(home + "/"))
           else "CORRAL_SHARED_DIR" if where is not None and where.startswith(str(SHARED_ROOT))
           else None)
    elsewhere = f", or set {var} to another directory" if var else ""
    if problem == "read-only":
        return f"cannot write {label}: the file system is read-only; make it writable{elsewhere}"
    if problem == "full":
        return f"cannot write {label}: the file system is full; free some space{elsewhere}"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"{label}: permission denied; fix its owner or mode{elsewhere}"
    reason = exc.strerror or type(exc).__name__
    return f"{label}: {reason}" + (f" (check {var})" if var else "")


def restrict_net_dir(directory: Path, sandbox_gid: int | None) -> None:
    """Close a sandbox's socket directory to every user but the sandbox's own ids (and
    corral's): ``0700`` when the sandbox runs with corral's own gid (no isolation, or
    bubblewrap without root), ``0710`` with the sandbox's gid as its group when corral is
    root (the sandbox may enter, not list or write). ``None`` (the sandbox's host ids are
    not known): left as it is, and the run's token alone guards its sockets."""
    if sandbox_gid is None:
        return
    if sandbox_gid == os.getegid():
        os.chmod(directory, 0o700)
    elif os.geteuid() == 0:
        os.chown(directory, 0, sandbox_gid)
        os.chmod(directory, 0o710)


def socket_access(directory: Path) -> tuple[int, int | None]:
    """The mode (and group, ``None``: unchanged) a unix socket bound in ``directory`` gets:
    the directory decides who reaches its sockets (:func:`restrict_net_dir`). A directory
    only its owner enters: ``0600``; one its group enters too: ``0660`` with its group;
    any other: ``0666`` (whoever can enter the directory may connect; the service behind
    the socket must check its clients itself)."""
    st = os.stat(directory)
    if st.st_mode & 0o077 == 0:
        return 0o600, None
    if st.st_mode & 0o007 == 0:
        return 0o660, st.st_gid
    return 0o666, None


def apply_socket_access(path: str | os.PathLike[str]) -> None:
    """Give the unix socket bound at ``path`` the access its directory decides
    (:func:`socket_access`). Call it before the socket listens (or before it appears at a
    path clients look at): nobody connects in between."""
    mode, gid = socket_access(Path(path).parent)
    if gid is not None and gid != os.stat(path).st_gid:
        os.chown(path, -1, gid)
    os.chmod(path, mode)
