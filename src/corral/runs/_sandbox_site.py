"""The agent site inside the sandbox (:class:`SandboxSite`; providers with
``supervisor_inside``: docker, and every remote or VM provider after it), seen from any host.

Such a run's record says ``journal.inside``. Its journal is never read from the host that
started it: every host keeps its own mirror of the journal in its journals directory (the
same file names as a host-side journal, so the reader, the probe and the translation are
the ones every run uses) and copies the bytes it lacks from the sandbox through the
provider's API (:class:`corral.sandbox._inside.InsideSupervisor`), from the mirror's length
on. The mirror holds the journal and its stderr sidecar only: never the supervisor's
status (its pids are the sandbox's, not this host's). Probing the exit, stopping the agent
and reading go through the API too, so a host with another ``$CORRAL_HOME`` (another
machine) takes over, cancels or reaps the run with nothing from the first.

An agent CLI's services daemon runs on the host that drives the run; it watches this host's
note of the agent's state next to the mirror (``JournalPaths.agent_state``), which every
driver's end of the run marks ``exited``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final

import anyio
import anyio.to_thread

from corral._errors import ConfigError, CorralError
from corral._log import library_logger
from corral._paths import corral_home
from corral.journal._layout import JournalPaths, encode_run_id
from corral.journal._exit_probe import ProbeResult, probe_exit
from corral.runs._site import ProviderFor, SiteBase, SupervisedCommand, recorded_sandbox
from corral.sandbox._contracts import Handle, SandboxGoneError
from corral.sandbox._inside import InsideSupervisor
from corral.stores._records import RunRecord

__all__ = ["GONE", "MIRROR_POLL", "SandboxSite", "mirror_paths"]

log = library_logger("corral.runs._runner")

MIRROR_POLL: Final = 0.1
"""How often a driver copies new journal bytes from the sandbox."""

GONE: Final = "gone"
"""The agent state a driver notes next to the mirror when the run's sandbox vanished: the
journal reader then stops waiting for bytes that can never come (see
:func:`corral.journal._reader.read_journal`'s liveness check)."""

_UNRESOLVED: Final = object()


def mirror_paths(run_id: str, journals_dir: Path | None = None) -> JournalPaths:
    """This host's mirror of the run's journal."""
    return JournalPaths.for_run(journals_dir or corral_home() / "journals", run_id)


@dataclass(slots=True)
class SandboxSite(SiteBase):
    """The run's supervisor lives in its sandbox (see the module docstring)."""

    RECORD: ClassVar[Mapping[str, Any]] = {"inside": True}
    HOST_BRIDGE: ClassVar[bool] = False

    _handle: object = field(default=_UNRESOLVED, repr=False)
    """The sandbox's :class:`InsideSupervisor` once resolved (``None``: it is gone)."""

    @classmethod
    def started(cls, handle: Handle, run_id: str, paths: JournalPaths, nonce: str,
                provider_for: ProviderFor) -> SandboxSite:
        return cls(run_id, paths, nonce, (handle.ref.provider, handle.id), provider_for,
                   _handle=handle if isinstance(handle, InsideSupervisor) else None)

    @classmethod
    def recorded(cls, record: RunRecord, nonce: str, directory: str,
                 journals_dir: Path | None, provider_for: ProviderFor | None) -> SandboxSite:
        # this host's own mirror, wherever the starting host kept its journals
        return cls(record.run_id, mirror_paths(record.run_id, journals_dir), nonce,
                   recorded_sandbox(record), provider_for, record)

    @property
    def token(self) -> str:
        """The run's file-name token in the sandbox."""
        return encode_run_id(self.run_id)

    async def supervisor(self) -> InsideSupervisor | None:
        """The run's sandbox, resolved once (``None``: it is gone or names none)."""
        if self._handle is _UNRESOLVED:
            handle = await self.resume()
            self._handle = handle if isinstance(handle, InsideSupervisor) else None
        return self._handle if isinstance(self._handle, InsideSupervisor) else None

    def check_here(self) -> None:
        return  # every host reads the journal through the provider's API

    async def launch(self, command: SupervisedCommand) -> int:
        if command.host_job is not None:
            raise ConfigError("a host process beside the supervisor (an ACP bridge) cannot "
                              "run where the supervisor runs in the sandbox")
        handle = await self.supervisor()
        if handle is None:
            raise CorralError(f"the run's sandbox {self.sandbox!r} cannot host its supervisor "
                              "(it is gone, or its handle is no InsideSupervisor)")
        return await handle.launch_supervised(
            self.token, argv=command.argv, env=command.env, cwd=command.cwd,
            nonce=self.nonce, stdin=command.stdin, timeout=command.timeout,
            max_output=command.max_output, redact=command.redact)

    async def stop(self, grace: float, *, supervisor: bool = False) -> None:
        # (the supervisor in the sandbox writes the exit trailer and exits by itself)
        handle = await self.supervisor()
        if handle is None:
            return
        await handle.stop_supervised(self.token, grace)
        await self.refresh()  # the journal's end into the mirror
        await self.note_exited()

    async def probe(self, *, max_bytes: int = 65536, recent: float = 30.0) -> ProbeResult:
        gone = None
        # through the provider's API: copy the journal's end, ask the supervisor
        try:
            handle = await self.supervisor()
            await self.refresh()
            if handle is not None:
                status = await handle.supervisor_status(self.token)
                if status.get("state") == "running":
                    return ProbeResult.producing()
            else:
                gone = await self.gone()
            await self.note_exited()
        except Exception as exc:  # noqa: BLE001 - a probe never raises
            return ProbeResult.unknown(f"the sandbox's journal is unreachable: {exc}")
        probe = await probe_exit(self.paths, self.nonce, max_bytes=max_bytes, recent=recent)
        if gone is not None and probe.state != "finished":
            # what this host's copy of the journal lacks went with the sandbox
            return ProbeResult.gone(str(gone))
        return probe

    async def refresh(self) -> bool:
        return await refresh_mirror(self.token, self.paths, await self.supervisor())

    async def follow(self) -> None:
        """Keep the mirror up to date (until cancelled, or until the supervisor has exited
        and its last bytes are copied).

        When the sandbox vanishes (``docker rm -f``, another host's cleanup) it notes
        :data:`GONE` next to the mirror, so the reader stops following at once instead of
        waiting for bytes no one can write; another failure (the daemon briefly
        unreachable) is retried, more slowly."""
        handle = await self.supervisor()
        if handle is None:
            return
        pause = MIRROR_POLL
        while True:
            try:
                await refresh_mirror(self.token, self.paths, handle)
                status = await handle.supervisor_status(self.token)
                if status.get("state") == "exited":
                    await refresh_mirror(self.token, self.paths, handle)
                    await self.note_exited()  # an agent CLI's services stop now
                    return
                pause = MIRROR_POLL
            except (CorralError, OSError) as exc:
                if await self.gone() is not None:
                    log.info("run %s: its sandbox is gone: %s", self.run_id, exc)
                    await anyio.to_thread.run_sync(_mark_state, self.paths, GONE)
                    return
                log.info("run %s: journal mirror: %s (trying again)", self.run_id, exc)
                pause = min(pause * 2, 2.0)
            await anyio.sleep(pause)

    async def lost(self) -> SandboxGoneError | None:
        # with the sandbox gone, what this host's mirror lacks (all of it, on a host that
        # never mirrored the run) is lost
        if await self.supervisor() is not None or \
                (await probe_exit(self.paths, self.nonce)).state == "finished":
            return None
        return await self.gone()

    async def agent_running(self) -> bool:
        # absent: another host started the run, so assume it runs (every driver's end of
        # the run marks it exited)
        return _noted_state(self.paths.agent_state) != "exited"

    async def services_watch(self) -> Path | None:
        await anyio.to_thread.run_sync(_mark_state, self.paths, "running")
        return self.paths.agent_state

    async def note_exited(self) -> None:
        if self.paths.agent_state.exists():
            await anyio.to_thread.run_sync(_mark_state, self.paths, "exited")


def _mark_state(paths: JournalPaths, state: str) -> None:
    """Atomically write this host's note of the agent's state (``{"state": ...}``)."""
    paths.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    target = paths.agent_state
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps({"state": state}))
    os.replace(tmp, target)


def _noted_state(path: Path) -> str | None:
    try:
        state = json.loads(path.read_text()).get("state")
    except (OSError, ValueError, AttributeError):
        return None
    return state if isinstance(state, str) else None


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


async def refresh_mirror(token: str, paths: JournalPaths,
                         handle: InsideSupervisor | None) -> bool:
    """Copy the bytes the mirror lacks from the sandbox; return whether the sandbox holds
    a journal (``False``: the agent was never launched, or the sandbox is gone)."""
    if handle is None:
        return False
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
