"""Test helper: prove that no secret value reached anything corral wrote.

:func:`written_roots` lists every directory corral writes to for an environment
(``$CORRAL_HOME``: store, journals, sessions, sandbox state; the shared
directory, default ``/var/lib/corral``: socket directories and, as root, bubblewrap
sandboxes; ``$CORRAL_BWRAP_FILES``), and :func:`assert_nothing_written_holds` scans every
file under them (agent installs and loop-device images excepted, see below).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from corral.sandbox._leakscan import Finding, scan_paths

__all__ = [
    "assert_no_secrets",
    "assert_nothing_written_holds",
    "find_secrets",
    "install_dirs",
    "written_roots",
]


def find_secrets(paths: Iterable[str | Path], secrets: Mapping[str, str]) -> list[Finding]:
    """Every file under ``paths`` holding a secret value or a common encoding of one
    (loop-device images excepted: their contents are scanned through their mounts)."""
    existing = [Path(p) for p in paths if Path(p).exists()]
    files = [str(p) for p in existing if p.is_file()]
    files += _files([p for p in existing if p.is_dir()], ())
    return scan_paths(files, secrets)


def assert_no_secrets(paths: Iterable[str | Path], secrets: Mapping[str, str]) -> None:
    """Fail (AssertionError naming files and secret *names*) if any value is found."""
    paths = list(paths)
    assert any(Path(p).exists() for p in paths), f"nothing to scan among {paths}"
    hits = find_secrets(paths, secrets)
    assert not hits, "secret values found in: " + ", ".join(f"{h.path} ({h.secret})" for h in hits)


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def _home(env: Mapping[str, str]) -> Path:
    raw = env.get("CORRAL_HOME")
    return Path(raw).expanduser() if raw else Path.home() / ".corral"


def _shared(env: Mapping[str, str]) -> Path:
    return Path(env.get("CORRAL_SHARED_DIR", "/var/lib/corral"))


def written_roots(env: Mapping[str, str] | None = None) -> list[Path]:
    """Every directory corral (run with ``env``, default this process's environment) writes
    to, those that exist: ``$CORRAL_HOME``, the bubblewrap files root
    (``$CORRAL_BWRAP_FILES``, default ``<shared>/bubblewrap``) and the rest of the shared
    directory (``$CORRAL_SHARED_DIR``, default ``/var/lib/corral``: socket directories,
    agent installs) except another environment's default bubblewrap files root."""
    e = _env(env)
    shared = _shared(e)
    files = Path(e["CORRAL_BWRAP_FILES"]) if e.get("CORRAL_BWRAP_FILES") else shared / "bubblewrap"
    roots = [_home(e), files]
    try:
        roots += sorted(p for p in shared.iterdir() if p.name != "bubblewrap")
    except OSError:
        pass
    out: list[Path] = []
    for root in roots:
        if root.exists() and not any(root == o or root.is_relative_to(o) for o in out):
            out.append(root)
    return out


def _loop_images() -> set[str]:
    """Files backing a loop device (a file system image such as a disk-quota volume): what
    they hold is scanned through the mounted file system, not as raw blocks."""
    images: set[str] = set()
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            images.add(os.path.realpath(backing.read_text().strip()))
        except OSError:
            continue
    return images


def install_dirs(env: Mapping[str, str] | None = None) -> list[Path]:
    """The agent CLI installs under the written roots (``agents/`` in ``$CORRAL_HOME`` and
    the shared directory, and ``$CORRAL_AGENTS_DIR``): npm packages written once from the
    registry, before any run, and bound read-only into sandboxes, so no run's secret can
    reach them. Scans skip them (hundreds of megabytes of JavaScript)."""
    e = _env(env)
    dirs = [_home(e) / "agents", _shared(e) / "agents"]
    if e.get("CORRAL_AGENTS_DIR"):
        dirs.append(Path(e["CORRAL_AGENTS_DIR"]).expanduser())
    return dirs


def _files(roots: Iterable[Path], skip: Iterable[Path]) -> list[str]:
    skipped = {os.path.realpath(s) for s in skip}
    images = _loop_images()
    files: list[str] = []
    for root in roots:
        for dirpath, dirnames, names in os.walk(root):
            # prune skipped trees (and never descend through symlinks: os.walk does not)
            dirnames[:] = [d for d in dirnames
                           if os.path.realpath(os.path.join(dirpath, d)) not in skipped]
            files.extend(f for f in (os.path.join(dirpath, n) for n in names)
                         if os.path.realpath(f) not in images)
    return files


def assert_nothing_written_holds(
    secrets: Mapping[str, str],
    env: Mapping[str, str] | None = None,
    *,
    extra: Iterable[str | Path] = (),
    skip: Iterable[str | Path] | None = None,
) -> list[Path]:
    """Scan every file under :func:`written_roots` (and ``extra``) for the ``secrets``'
    values and their encodings; fail naming files and secret names. ``skip`` defaults to
    :func:`install_dirs`. Returns the roots scanned."""
    roots = [*written_roots(env), *(Path(p) for p in extra if Path(p).exists())]
    assert roots, "nothing to scan: no directory corral writes to exists"
    skipped = [Path(s) for s in (install_dirs(env) if skip is None else skip)]
    hits = scan_paths(_files(roots, skipped), secrets)
    assert not hits, "secret values found in: " + ", ".join(f"{h.path} ({h.secret})" for h in hits)
    return roots
