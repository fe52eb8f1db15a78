"""Bootstrap a fresh sandbox: source, AGENTS.md, setup plan, then the marker (last).

Secrets reach setup only as exec-time environment (see :mod:`corral.sandbox._setup_shell`).
The marker ``/workspace/.corral/bootstrap.json`` records the workspace hash; a sandbox
without a matching marker (wiped underneath, or an interrupted bootstrap) is bootstrapped
again by ``ensure``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral._errors import CorralError
from corral._paths import corral_home
from corral.sandbox._contracts import Handle
from corral.sandbox._copyguard import StateGuard
from corral.sandbox._gitsrc import clone_source
from corral.sandbox._redact import Redactor
from corral.sandbox._setup_shell import run_setup
from corral.sandbox._sources import Files, GitSource, LocalDir
from corral.sandbox._transfer import CopyLimit, copy_dir_into
from corral.sandbox._workspace import Workspace

__all__ = [
    "AGENT_FILE_LINKS",
    "MARKER_PATH",
    "BootstrapResult",
    "agents_md",
    "bootstrap",
    "read_marker",
]

MARKER_PATH = ".corral/bootstrap.json"
AGENT_FILE_LINKS = ("CLAUDE.md", "GEMINI.md")
_OURS_BEGIN = "<!-- corral: instructions -->"
_OURS_END = "<!-- corral: end -->"


@dataclass(frozen=True, slots=True)
class BootstrapResult:
    workspace_hash: str
    commit: str | None
    bootstrapped_at: float


def agents_md(workspace: Workspace) -> str | None:
    """The corral part of AGENTS.md: instructions plus a sorted list of scripts."""
    parts: list[str] = []
    if workspace.instructions and workspace.instructions.strip():
        parts.append(workspace.instructions.strip())
    if workspace.scripts:
        lines = ["## Workspace scripts", ""]
        lines += [f"- `{name}`: `{cmd}`" for name, cmd in sorted(workspace.scripts.items())]
        parts.append("\n".join(lines))
    if not parts:
        return None
    return "\n\n".join(parts)


async def read_marker(handle: Handle) -> dict[str, Any] | None:
    """The bootstrap marker's contents, or ``None`` when missing or unreadable."""
    try:
        raw = await handle.fs.read(MARKER_PATH)
        data = json.loads(raw)
    except (OSError, ValueError, CorralError):
        return None
    return data if isinstance(data, dict) else None


async def _materialize(handle: Handle, workspace: Workspace) -> str | None:
    src = workspace.source
    limit = CopyLimit.resolve(workspace.copy_limit_bytes)
    if isinstance(src, GitSource):
        if await handle.fs.exists(".git"):
            return None  # an earlier, interrupted bootstrap already cloned
        tmp_root = corral_home() / "tmp"
        tmp_root.mkdir(mode=0o700, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix="clone-", dir=tmp_root))
        try:
            dest = tmp / "repo"
            commit = await clone_source(src, dest, workspace.secrets)
            await copy_dir_into(handle, dest, "/workspace", limit=limit)
            return commit
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if isinstance(src, LocalDir):
        # Checked here, not when the definition is built: it depends on this process's
        # $CORRAL_HOME. (The git clone above lives in $CORRAL_HOME/tmp, hence LocalDir only.)
        StateGuard.current().refuse_source(src.path)
        await copy_dir_into(handle, Path(src.path), "/workspace", exclude=src.exclude,
                            limit=limit, ignore_files=src.ignore_files)
    elif isinstance(src, Files):
        for path, content in src.files.items():
            parent = path.rsplit("/", 1)[0] if "/" in path else ""
            if parent:
                await handle.fs.mkdir(parent, parents=True)
            data = content.encode("utf-8") if isinstance(content, str) else content
            await handle.fs.write(path, data)
    return None


async def _write_agents_md(handle: Handle, workspace: Workspace) -> None:
    ours = agents_md(workspace)
    if ours is None:
        return
    block = f"{_OURS_BEGIN}\n{ours}\n{_OURS_END}\n"
    theirs = ""
    if await handle.fs.exists("AGENTS.md"):
        theirs = (await handle.fs.read("AGENTS.md")).decode("utf-8", "replace")
        if _OURS_BEGIN in theirs and _OURS_END in theirs:  # from an earlier bootstrap
            theirs = theirs.split(_OURS_END, 1)[1].lstrip("\n")
    await handle.fs.write("AGENTS.md", (block + ("\n" + theirs if theirs else "")).encode())
    for name in AGENT_FILE_LINKS:
        if await handle.fs.exists(name):
            info = await handle.fs.stat(name)
            if info.type != "symlink":
                continue  # the repository's own file wins
        res = await handle.process.exec(["ln", "-sfn", "AGENTS.md", name], cwd=handle.workdir, timeout=60)
        if not res.ok:
            await handle.fs.write(name, await handle.fs.read("AGENTS.md"))


async def _exclude_from_git(handle: Handle) -> None:
    if not await handle.fs.exists(".git/info"):
        return
    path = ".git/info/exclude"
    current = (await handle.fs.read(path)).decode("utf-8", "replace") if await handle.fs.exists(path) else ""
    if "/.corral/" not in current.splitlines():
        await handle.fs.write(path, (current.rstrip("\n") + "\n/.corral/\n").lstrip("\n").encode())


async def bootstrap(
    handle: Handle,
    workspace: Workspace,
    *,
    env: Mapping[str, str],
    redactor: Redactor,
) -> BootstrapResult:
    """Bootstrap ``handle``. Raises (GitError, SetupError, …) on any failure; the caller
    destroys the sandbox. ``env`` is the exec-time environment (secrets included)."""
    commit = await _materialize(handle, workspace)
    await _write_agents_md(handle, workspace)
    await _exclude_from_git(handle)
    await run_setup(handle, workspace.steps, env=env, redactor=redactor)
    result = BootstrapResult(workspace.hash(), commit, time.time())
    await handle.fs.mkdir(".corral", parents=True)
    marker = {
        "workspace_hash": result.workspace_hash,
        "commit": commit,
        "bootstrapped_at": result.bootstrapped_at,
    }
    await handle.fs.write(MARKER_PATH, json.dumps(marker).encode())
    return result
