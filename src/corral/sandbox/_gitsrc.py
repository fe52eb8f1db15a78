"""Clone a :class:`~corral.sandbox._sources.GitSource` on the host.

Cloning happens on the host (which has the network and the credentials; the sandbox has
neither), into a private temporary directory that bootstrap then streams into the
sandbox. Every git command's exit status is checked: a failure raises :class:`GitError`
with git's stderr (redacted). A commit SHA works as a ref (fetched by id, falling back
to a full fetch when the server refuses). A token from ``auth`` reaches git through a
credential helper that reads it from git's environment, never argv or ``.git/config``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import anyio

from corral._errors import CorralError, PrerequisiteMissing
from corral.sandbox._redact import Redactor, live_redactor
from corral.sandbox._secrets import Secrets
from corral.sandbox._sources import GitSource

__all__ = ["GitError", "clone_source"]

_TOKEN_ENV = "CORRAL_GIT_TOKEN"
# The helper script names the variable, never the value.
_HELPER = f'!f() {{ echo username=x-access-token; echo "password=${_TOKEN_ENV}"; }}; f'
GIT_TIMEOUT = 600.0


class GitError(CorralError):
    """A git command failed; the message carries git's stderr (secrets redacted)."""


def _git_env(token: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_TERMINAL_PROMPT="0",
        GIT_ASKPASS="/bin/true",
        GIT_CONFIG_NOSYSTEM="1",
        LC_ALL="C",
    )
    if token is not None:
        env[_TOKEN_ENV] = token
    return env


async def _git(
    args: Sequence[str], *, cwd: Path | None, env: Mapping[str, str], what: str, redactor: Redactor
) -> str:
    git = shutil.which("git")
    if git is None:
        raise PrerequisiteMissing("git is not installed on the host: `apt-get install git`")
    argv = [git, "-c", "credential.helper=", "-c", f"credential.helper={_HELPER}", *args]
    with anyio.fail_after(GIT_TIMEOUT):
        proc = await anyio.run_process(argv, cwd=cwd, env=dict(env), check=False)
    if proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip()
        err = redactor.redact(live_redactor().redact(err))
        raise GitError(f"git {what} failed (exit {proc.returncode}): {err[-2000:] or 'no output'}")
    return proc.stdout.decode("utf-8", "replace").strip()


async def clone_source(source: GitSource, dest: Path, secrets: Secrets) -> str:
    """Clone ``source`` into the empty directory ``dest``; return the checked-out commit."""
    token = secrets.resolve(source.auth) if source.auth else None
    env = _git_env(token)
    red = secrets.redactor()
    url = source.url
    depth = ["--depth", str(source.depth)] if source.depth else []
    pinned = source.pinned_commit

    async def git(*args: str, what: str, cwd: Path | None = dest) -> str:
        return await _git(args, cwd=cwd, env=env, what=what, redactor=red)

    if pinned is None:
        branch = ["--branch", source.ref] if source.ref else []
        await git(
            "clone", "--quiet", "--no-recurse-submodules", *depth, *branch, "--", url, str(dest),
            what=f"clone of {url}" + (f" at {source.ref!r}" if source.ref else ""),
            cwd=None,
        )  # fmt: skip
    else:
        await git("init", "--quiet", "--", str(dest), what="init", cwd=None)
        await git("remote", "add", "origin", "--", url, what="remote add")
        try:
            await git("fetch", "--quiet", *depth, "origin", pinned, what=f"fetch of {pinned}")
        except GitError:
            # servers that refuse unadvertised objects: fetch everything, then look
            await git("fetch", "--quiet", "--tags", "origin", "+refs/heads/*:refs/remotes/origin/*",
                      what=f"fetch of {url}")  # fmt: skip
            try:
                await git("cat-file", "-e", f"{pinned}^{{commit}}", what="lookup")
            except GitError:
                raise GitError(f"commit {pinned} is not in {url}") from None
        if source.commit and source.ref and source.ref != pinned:
            await git("checkout", "--quiet", "-B", source.ref, pinned, what=f"checkout of {pinned}")
        else:
            await git("checkout", "--quiet", "--detach", pinned, what=f"checkout of {pinned}")
    head = await git("rev-parse", "HEAD", what="rev-parse")
    if pinned is not None and head != pinned:
        raise GitError(f"checked out {head} but the source pins {pinned}")
    return head
