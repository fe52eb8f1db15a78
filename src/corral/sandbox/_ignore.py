"""Which files of a workspace directory to copy when its ignore files are honoured
(``LocalDir(ignore_files=True)``, ``corral run --workspace DIR`` by default): what
``.gitignore`` files (and ``.corralignore`` files, same syntax) leave out is not copied, nor
is ``.git``.

git itself is the matcher, so the rules are git's exactly. It runs with an empty git
directory of its own and the workspace as its work tree: the workspace's ``.git`` (its
config, hooks, ``core.fsmonitor``: a hostile repository's means of running a command) is
never read, and tracked files are judged like untracked ones. The result is only ever a
filter on corral's own walk of the directory (:mod:`corral.sandbox._transfer`), so an ignore
file can only leave files out, never bring anything in from outside.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from corral._errors import ConfigError

__all__ = ["IGNORE_FILES", "Kept", "kept_files"]

IGNORE_FILES = (".gitignore", ".corralignore")


@dataclass(frozen=True, slots=True)
class Kept:
    """The paths (relative, ``/``-separated) the ignore files keep. A nested repository
    (a directory with its own ``.git``, which git lists whole) is kept but for its
    ``.git``; its own ignore files are not read."""

    files: frozenset[str]  # files and symlinks
    dirs: frozenset[str]  # every directory above a kept path
    whole: frozenset[str]  # directories git lists whole (a nested repository)

    def _under_whole(self, rel: str) -> bool:
        # a nested repository is copied whole, but for its .git
        return ".git" not in rel.split("/") and any(
            rel == w or rel.startswith(w + "/") for w in self.whole)

    def keeps_dir(self, rel: str) -> bool:
        return rel in self.dirs or self._under_whole(rel)

    def keeps_file(self, rel: str) -> bool:
        return rel in self.files or self._under_whole(rel)


def _ls_files(root: Path, gitdir: str, per_directory: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_DIR=gitdir, GIT_WORK_TREE=str(root), GIT_CONFIG_NOSYSTEM="1",
               GIT_CONFIG_GLOBAL=os.devnull)
    argv = ["git", "-c", "core.fsmonitor=false", "-c", "core.quotePath=false", "ls-files",
            "-z", "--others", f"--exclude-per-directory={per_directory}"]
    try:
        out = subprocess.run(argv, cwd=root, env=env, capture_output=True, timeout=600,
                             check=False)
    except OSError as exc:
        raise ConfigError(f"cannot honour {root}'s .gitignore: git cannot run ({exc}); "
                            "install git, or pass --no-ignore to copy everything") from None
    if out.returncode != 0:
        why = out.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["failed"]
        raise ConfigError(f"cannot honour {root}'s .gitignore: git ls-files: {why[0]}; "
                            "pass --no-ignore to copy everything")
    return [p for p in out.stdout.decode(errors="surrogateescape").split("\0") if p]


def kept_files(root: Path) -> Kept:
    """What to copy of ``root``: what no ``.gitignore`` nor ``.corralignore`` under it
    excludes (git's rules), ``.git`` left out."""
    if shutil.which("git") is None:
        raise ConfigError(f"cannot honour {root}'s .gitignore: git is not installed; "
                            "install it (apt-get install git), or pass --no-ignore")
    with tempfile.TemporaryDirectory(prefix="corral-ignore-") as tmp:
        gitdir = os.path.join(tmp, "git")
        init = subprocess.run(["git", "init", "-q", "--bare", gitdir], capture_output=True,
                              env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1"}, check=False)
        if init.returncode != 0:
            raise ConfigError("cannot honour .gitignore: git init failed: "
                                + init.stderr.decode(errors="replace").strip())
        # an empty info/exclude: no patterns but the workspace's own files
        paths = set(_ls_files(root, gitdir, ".gitignore"))
        if any(p == ".corralignore" or p.endswith("/.corralignore") for p in paths):
            paths &= set(_ls_files(root, gitdir, ".corralignore"))
    files: set[str] = set()
    whole: set[str] = set()
    for p in paths:
        if p.endswith("/"):
            whole.add(p.rstrip("/"))
        else:
            files.add(p)
    dirs: set[str] = set()
    for p in files | whole:
        parts = p.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:i]))
    return Kept(frozenset(files), frozenset(dirs), frozenset(whole))

