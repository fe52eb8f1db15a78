"""One agent install per harness and version for every home, when corral runs as root.

An agents root the sandboxes' unprivileged uid cannot enter (``~/.corral/agents`` under a
mode-0700 home) cannot be bound into a sandbox, so as root the files of an install live
under :data:`~corral._paths.SHARED_ROOT`. They live there once per version:

* ``<shared>/agents/installs/<name>/<version>/``: the npm prefix and its marker, root-owned,
  mode 0755 (the sandboxes' uid reads it). Every home's sandboxes get ``installs/``
  read-only at the agents mount; a home's entry ``<root>/<name>/<version>`` is a symlink to
  the version's directory.
* ``<shared>/agents/refs/<name>/<version>/<digest of root>``: one reference file per agents
  root that links to the install (mode 0700 directories: home paths are nobody else's
  business and never bound into a sandbox). A reference counts while its root's entry
  still resolves to the install, so a deleted home stops counting without being told.

The shared directories are used only when they can be trusted the way the init cache is
(``corral.providers._bwrap_init.untrusted``): every directory from ``/`` down belongs to
root (or corral's user) and no other user can write it. Otherwise, and for a root that
already holds installs of the older per-root layout (``<shared>/agents/<digest of root>``),
installs stay per root as before.

:func:`prune_installs` (``corral agents prune``) removes the versions no agents root
references and no running process uses (its executable, working directory, open files or
mapped libraries are in the install: checked by device and inode, which holds across the
sandboxes' mount namespaces).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from corral._paths import SHARED_ROOT
from corral.harness._packages import KNOWN_AGENTS
from corral.providers._bwrap_init import untrusted

__all__ = [
    "PruneReport",
    "PrunedInstall",
    "add_ref",
    "installs_dir",
    "legacy_dir",
    "prune_installs",
    "shared_for",
]

MARKER = "corral-install.json"


def installs_dir() -> Path:
    """``<shared>/agents/installs``: one directory per name and version."""
    return SHARED_ROOT / "agents" / "installs"


def refs_dir() -> Path:
    """``<shared>/agents/refs``: who links to which install (root only)."""
    return SHARED_ROOT / "agents" / "refs"


def _digest(root: Path) -> str:
    return hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:16]


def legacy_dir(root: Path) -> Path:
    """The older per-root storage of ``root``'s installs (still used where it has some)."""
    return SHARED_ROOT / "agents" / _digest(root)


def _has_legacy_installs(root: Path) -> bool:
    legacy = str(legacy_dir(root)) + "/"
    for name in KNOWN_AGENTS:
        try:
            entries = list((root / name).iterdir())
        except OSError:
            continue
        for entry in entries:
            if entry.is_symlink() and os.path.realpath(entry).startswith(legacy):
                return True
    return False


def trust_problem() -> str | None:
    """Why the shared installs cannot be used (made if missing), or ``None``."""
    base = SHARED_ROOT / "agents"
    try:
        for d, mode in ((SHARED_ROOT, 0o755), (base, 0o755), (installs_dir(), 0o755),
                        (refs_dir(), 0o700)):
            if not d.is_dir():
                d.mkdir(mode=mode, exist_ok=True)
                os.chmod(d, mode)
        return (untrusted(installs_dir(), reachable=True)
                or untrusted(refs_dir(), reachable=False))
    except OSError as exc:
        return f"cannot use {base}: {exc.strerror}"


def shared_for(root: Path) -> bool:
    """Whether ``root``'s installs live in the shared, once-per-version directories (as
    root, for a root the sandboxes' uid cannot reach; see the module docstring)."""
    return os.geteuid() == 0 and not _has_legacy_installs(root) and trust_problem() is None


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """Held while an install is linked to a root or pruned, so neither sees half of the
    other."""
    fd = os.open(refs_dir() / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def add_ref(root: Path, name: str, version: str) -> None:
    """Record that ``root`` links to the shared install of ``name`` ``version``."""
    d = refs_dir() / name / version
    for p in (refs_dir() / name, d):
        p.mkdir(mode=0o700, exist_ok=True)
    ref = d / _digest(root)
    body = json.dumps({"root": str(root.resolve()), "since": time.time()})
    try:
        if json.loads(ref.read_text()).get("root") == str(root.resolve()):
            return
    except (OSError, ValueError, AttributeError):
        pass
    tmp = d / f".{ref.name}.{os.getpid()}"
    tmp.write_text(body)
    os.replace(tmp, ref)


def _live_refs(name: str, version: str, install: Path) -> tuple[list[str], list[Path]]:
    """The agents roots whose entry still resolves to ``install``, and the dead ref files."""
    live: list[str] = []
    dead: list[Path] = []
    d = refs_dir() / name / version
    try:
        refs = sorted(p for p in d.iterdir() if not p.name.startswith("."))
    except OSError:
        return live, dead
    for ref in refs:
        try:
            root = str(json.loads(ref.read_text())["root"])
        except (OSError, ValueError, KeyError, TypeError):
            dead.append(ref)
            continue
        entry = Path(root) / name / version
        if entry.is_symlink() and os.path.realpath(entry) == str(install):
            live.append(root)
        else:
            dead.append(ref)
    return sorted(live), dead


def _proc_files() -> dict[tuple[int, int], int]:
    """(device, inode) -> pid of every file a running process executes, works in, holds
    open or has mapped (``/proc``; a process that ends meanwhile is skipped)."""
    seen: dict[tuple[int, int], int] = {}
    me = os.getpid()
    for pid_name in os.listdir("/proc"):
        if not pid_name.isdigit() or int(pid_name) == me:
            continue
        pid = int(pid_name)
        base = f"/proc/{pid_name}"
        paths = [f"{base}/exe", f"{base}/cwd", f"{base}/root"]
        try:
            paths += [f"{base}/fd/{fd}" for fd in os.listdir(f"{base}/fd")]
        except OSError:
            pass
        for p in paths:
            try:
                st = os.stat(p)
            except OSError:
                continue
            seen.setdefault((st.st_dev, st.st_ino), pid)
        try:
            with open(f"{base}/maps") as maps:
                for line in maps:
                    parts = line.split()
                    if len(parts) < 6 or parts[4] == "0":
                        continue
                    major, minor = (int(x, 16) for x in parts[3].split(":"))
                    seen.setdefault((os.makedev(major, minor), int(parts[4])), pid)
        except (OSError, ValueError):
            continue
    return seen


def _user_of(install: Path, files: dict[tuple[int, int], int]) -> int | None:
    """A pid using a file or directory of ``install``, or ``None``."""
    for dirpath, dirnames, filenames in os.walk(install):
        for n in (dirpath, *(os.path.join(dirpath, f) for f in [*dirnames, *filenames])):
            try:
                st = os.lstat(n)
            except OSError:
                continue
            pid = files.get((st.st_dev, st.st_ino))
            if pid is not None:
                return pid
    return None


def _size(path: Path) -> int:
    total = 0
    for dirpath, _dirnames, filenames in os.walk(path):
        for f in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
            except OSError:
                pass
    return total


@dataclass(frozen=True, slots=True)
class PrunedInstall:
    """One shared install and what prune did with it."""

    name: str
    version: str
    path: Path
    bytes: int
    homes: tuple[str, ...]
    """The agents roots that link to it (empty when removed)."""
    reason: str
    """Why it was kept, or ``"no home uses it"``."""

    def as_json(self) -> dict[str, object]:
        """The install as one JSON object."""
        return {"name": self.name, "version": self.version, "path": str(self.path),
                "bytes": self.bytes, "homes": list(self.homes), "reason": self.reason}


@dataclass(slots=True)
class PruneReport:
    """What :func:`prune_installs` removed (or would remove) and kept."""

    dry_run: bool
    removed: list[PrunedInstall] = field(default_factory=list)
    kept: list[PrunedInstall] = field(default_factory=list)
    note: str = ""
    """Why nothing was looked at (not root, the shared directory cannot be trusted)."""

    def as_json(self) -> dict[str, object]:
        """The report as one JSON document."""
        return {"dry_run": self.dry_run, "removed": [p.as_json() for p in self.removed],
                "kept": [p.as_json() for p in self.kept], "note": self.note}


def _installs() -> Iterator[tuple[str, str, Path]]:
    for name in sorted(KNOWN_AGENTS):
        d = installs_dir() / name
        if not d.is_dir():
            continue
        for entry in sorted(d.iterdir()):
            if not entry.name.startswith(".") and entry.is_dir() and not entry.is_symlink():
                yield name, entry.name, entry


def prune_installs(*, dry_run: bool = False) -> PruneReport:
    """Remove the shared installs that no agents root links to and no running process uses
    (``dry_run``: only say which)."""
    report = PruneReport(dry_run=dry_run)
    if os.geteuid() != 0:
        report.note = ("agent installs are shared only when corral runs as root; this "
                       "user's installs are in its agents directory (corral agents ls)")
        return report
    if not (SHARED_ROOT / "agents").is_dir():
        return report
    problem = trust_problem()
    if problem:
        report.note = f"the shared agent installs are not used: {problem}"
        return report
    for name, version, path in _installs():
        with locked():
            _prune_one(report, name, version, path)
    return report


def _prune_one(report: PruneReport, name: str, version: str, path: Path) -> None:
    live, dead = _live_refs(name, version, path)
    dry_run = report.dry_run
    if not dry_run:
        for ref in dead:
            ref.unlink(missing_ok=True)
    if live:
        report.kept.append(PrunedInstall(name, version, path, _size(path), tuple(live),
                                         f"used by {len(live)} home(s)"))
        return
    pid = _user_of(path, _proc_files())
    if pid is not None:
        report.kept.append(PrunedInstall(name, version, path, _size(path), (),
                                         f"in use by a running process (pid {pid})"))
        return
    size = _size(path)
    if not dry_run:
        # out of the mounted directory at once, then deleted
        gone = path.parent / f".prune-{version}-{os.getpid()}-{time.monotonic_ns()}"
        os.rename(path, gone)
        shutil.rmtree(gone, ignore_errors=True)
        shutil.rmtree(refs_dir() / name / version, ignore_errors=True)
    report.removed.append(PrunedInstall(name, version, path, size, (), "no home uses it"))
