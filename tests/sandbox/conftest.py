"""Fixtures: a real bare git repo over file://, a SQLite store, real providers."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from corral.stores._protocols import Store
from corral.stores import open_store
from corral.testing._plugin import require


@dataclass
class Repo:
    url: str
    main_sha: str
    first_sha: str
    tag_sha: str
    feature_sha: str


def _git(cwd: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@x", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@x", GIT_CONFIG_NOSYSTEM="1", HOME=str(cwd))  # fmt: skip
    out = subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True)
    return out.stdout.strip()


@pytest.fixture(scope="session")
def git_repo(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Repo:
    """A bare repo: main (3 commits, v1 tags the 2nd), branch feature (1 extra commit)."""
    require(pytestconfig, shutil.which("git") is not None, "git", "apt-get install git")
    base = tmp_path_factory.mktemp("gitrepo")
    work = base / "work"
    work.mkdir()
    _git(work, "init", "-q", "-b", "main")
    (work / "version.txt").write_text("one\n")
    _git(work, "add", ".")
    _git(work, "commit", "-qm", "one")
    first = _git(work, "rev-parse", "HEAD")
    (work / "version.txt").write_text("two\n")
    _git(work, "commit", "-qam", "two")
    _git(work, "tag", "v1")
    tag = _git(work, "rev-parse", "HEAD")
    (work / "version.txt").write_text("three\n")
    _git(work, "commit", "-qam", "three")
    main = _git(work, "rev-parse", "HEAD")
    _git(work, "checkout", "-qb", "feature")
    (work / "version.txt").write_text("feature\n")
    _git(work, "commit", "-qam", "feature")
    feature = _git(work, "rev-parse", "HEAD")
    bare = base / "repo.git"
    _git(base, "clone", "-q", "--bare", str(work), str(bare))
    return Repo(f"file://{bare}", main, first, tag, feature)


@pytest.fixture
async def store(tmp_path: Path, corral_home: Path) -> AsyncIterator[Store]:
    st = await open_store(f"sqlite://{corral_home / 'corral.db'}")
    try:
        yield st
    finally:
        await st.aclose()


@pytest.fixture
def bwrap_ok(pytestconfig: pytest.Config) -> Iterator[None]:
    require(pytestconfig, shutil.which("bwrap") is not None, "bubblewrap", "apt-get install bubblewrap")
    yield
