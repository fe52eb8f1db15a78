"""Runs whose supervisor lives inside the sandbox (``Capabilities.supervisor_inside``: the
docker provider), seen from any host.

Such a run's record says ``journal.inside``. Its journal is never read from the host that
started it: every host keeps its own mirror of the journal in ``$CORRAL_HOME/journals`` (the
same file names as a host-side journal, so the reader, the probe and the translation are
the ones every run uses) and copies the bytes it lacks from the sandbox through the
provider's API (:class:`corral.sandbox._inside.InsideSupervisor`), from the mirror's length
on. The mirror holds the journal and its stderr sidecar only: never the supervisor's
status (its pids are the container's, not this host's). Probing the exit, stopping the
agent and reading go through the API too, so a host with another ``$CORRAL_HOME`` (another
machine) takes over, cancels or reaps the run with nothing from the first.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.to_thread

from corral._errors import CorralError
from corral._log import library_logger
from corral._paths import corral_home
from corral.journal._layout import JournalPaths, encode_run_id
from corral.sandbox._contracts import Provider, SandboxGoneError
from corral.sandbox._inside import InsideSupervisor
from corral.stores._records import RunRecord

__all__ = ["GONE", "MIRROR_POLL", "agent_state", "gone_error", "inside_handle", "is_inside",
           "mark_agent_state", "mirror_loop", "mirror_paths", "note_exited", "refresh_mirror",
           "sandbox_gone", "stop_inside"]

log = library_logger("corral.runs._runner")

MIRROR_POLL = 0.1
"""How often a driver copies new journal bytes from the sandbox."""


def is_inside(record: RunRecord) -> bool:
    """Whether the run's supervisor and journal live inside its sandbox."""
    return bool((record.journal or {}).get("inside"))


def mirror_paths(run_id: str, journals_dir: Path | None = None) -> JournalPaths:
    """This host's mirror of the run's journal."""
    return JournalPaths.for_run(journals_dir or corral_home() / "journals", run_id)


async def inside_handle(record: RunRecord,
                        provider_for: Callable[[str], Provider] | None = None
                        ) -> InsideSupervisor | None:
    """The run's sandbox (``None`` when it is gone or names no sandbox)."""
    ref = record.sandbox_ref or {}
    name, sandbox_id = ref.get("provider"), ref.get("id")
    if not isinstance(name, str) or not isinstance(sandbox_id, str):
        return None
    if provider_for is None:
        from corral.runs._providers import ProviderCache

        provider_for = ProviderCache().for_record(record)
    handle = await provider_for(name).resume(sandbox_id)
    return handle if isinstance(handle, InsideSupervisor) else None


GONE = "gone"
"""The agent state a driver notes next to the mirror when the run's sandbox vanished: the
journal reader then stops waiting for bytes that can never come (see
:func:`corral.journal._reader.read_journal`'s liveness check)."""

def gone_error(provider: str, sandbox_id: str) -> SandboxGoneError:
    """The error a run whose sandbox vanished under it ends with: it names the provider and
    the sandbox (the docker container's name), never a host path."""
    return SandboxGoneError.of(
        provider, sandbox_id, "it was removed while the run used it, so the agent's "
        "remaining output and its exit status are lost (what was logged is kept)")


async def sandbox_gone(record: RunRecord,
                       provider_for: Callable[[str], Provider] | None = None
                       ) -> SandboxGoneError | None:
    """The :func:`gone_error` of the run's sandbox when its provider says it no longer
    exists; ``None`` when it exists, the record names none, or the provider cannot tell
    (e.g. the Docker daemon is unreachable: that is not the sandbox's end)."""
    ref = record.sandbox_ref or {}
    name, sandbox_id = ref.get("provider"), ref.get("id")
    if not isinstance(name, str) or not isinstance(sandbox_id, str):
        return None
    if not is_inside(record) and os.geteuid() != 0:
        # Not root, a host-side sandbox is reachable from the home that made it only
        # (see corral.providers._bubblewrap's files index): elsewhere, not found means
        # nothing.
        where = (record.journal or {}).get("dir")
        if not isinstance(where, str) or Path(where).parent != corral_home(create=False):
            return None
    if provider_for is None:
        from corral.runs._providers import ProviderCache

        provider_for = ProviderCache().for_record(record)
    try:
        handle = await provider_for(name).resume(sandbox_id)
    except SandboxGoneError:
        return gone_error(name, sandbox_id)
    except CorralError as exc:
        log.info("run %s: cannot tell whether its sandbox exists: %s", record.run_id, exc)
        return None
    return gone_error(name, sandbox_id) if handle is None else None


def agent_state(paths: JournalPaths) -> Path:
    """This host's note of the agent's state (``{"state": "running" | "exited"}``) next to
    the mirror: what the run's services daemon on this host watches to stop with the agent
    (the supervisor's own status is in the sandbox)."""
    return paths.agent_state


def mark_agent_state(paths: JournalPaths, state: str) -> None:
    """Atomically write :func:`agent_state`."""
    paths.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    target = agent_state(paths)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps({"state": state}))
    os.replace(tmp, target)


async def note_exited(paths: JournalPaths) -> None:
    """Mark this host's note ``exited`` when there is one: the run's services daemon on this
    host (if any) stops with the agent."""
    if agent_state(paths).exists():
        await anyio.to_thread.run_sync(mark_agent_state, paths, "exited")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return -1


def _write_at(path: Path, offset: int, data: bytes) -> None:
    """Write ``data`` at ``offset`` (where it sits in the sandbox's journal), not at the end:
    another process of this host (a probe, the reaper) may copy the same bytes at the same
    time, and the journal only grows, so both writes put the same bytes in the same place."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        view, done = memoryview(data), 0
        while done < len(data):
            done += os.pwrite(fd, view[done:], offset + done)
    finally:
        os.close(fd)


async def refresh_mirror(record: RunRecord, paths: JournalPaths,
                         handle: InsideSupervisor | None) -> bool:
    """Copy the bytes the mirror lacks from the sandbox; return whether the sandbox holds
    a journal (``False``: the agent was never launched, or the sandbox is gone)."""
    if handle is None:
        return False
    token = encode_run_id(record.run_id)
    found = False
    for name, local in (("journal", paths.journal), ("journal.err", paths.stderr)):
        while True:
            size = await anyio.to_thread.run_sync(_size, local)  # -1: no mirror file yet
            have = max(0, size)
            data = await handle.read_journal(token, name, have)
            if data is None:
                break
            if name == "journal":
                found = True
            if not data and size >= 0:  # nothing new, and the mirror file exists
                break
            await anyio.to_thread.run_sync(_write_at, local, have, data)
            if len(data) < (4 << 20):
                break
    return found


async def mirror_loop(record: RunRecord, paths: JournalPaths,
                      handle: InsideSupervisor,
                      provider_for: Callable[[str], Provider] | None = None) -> None:
    """Keep the mirror up to date while a driver follows it (until cancelled, or until the
    supervisor has exited and its last bytes are copied).

    When the sandbox vanishes (``docker rm -f``, another host's cleanup) it notes
    :data:`GONE` next to the mirror, so the reader stops following at once instead of
    waiting for bytes no one can write; another failure (the daemon briefly unreachable)
    is retried, more slowly."""
    token = encode_run_id(record.run_id)
    pause = MIRROR_POLL
    while True:
        try:
            await refresh_mirror(record, paths, handle)
            status = await handle.supervisor_status(token)
            if status.get("state") == "exited":
                await refresh_mirror(record, paths, handle)
                await note_exited(paths)  # an agent CLI's services stop now
                return
            pause = MIRROR_POLL
        except (CorralError, OSError) as exc:
            if await sandbox_gone(record, provider_for) is not None:
                log.info("run %s: its sandbox is gone: %s", record.run_id, exc)
                await anyio.to_thread.run_sync(mark_agent_state, paths, GONE)
                return
            log.info("run %s: journal mirror: %s (trying again)", record.run_id, exc)
            pause = min(pause * 2, 2.0)
        await anyio.sleep(pause)


async def stop_inside(record: RunRecord, paths: JournalPaths | None, grace: float,
                      provider_for: Callable[[str], Provider] | None = None) -> None:
    """Stop the run's agent through the provider's API (the supervisor writes the exit
    trailer) and copy the journal's end into the mirror."""
    handle = await inside_handle(record, provider_for)
    if handle is None:
        return
    await handle.stop_supervised(encode_run_id(record.run_id), grace)
    if paths is not None:
        await refresh_mirror(record, paths, handle)
        await note_exited(paths)
