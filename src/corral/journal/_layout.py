"""Where a run's journal files live, and the supervisor's status file.

All files sit in one host-private directory (the provider's per-sandbox state directory,
never mounted into the sandbox), named after the run id:

- ``<token>.journal``: the agent's stdout, then the exit trailer (:mod:`corral.journal._sentinel`);
- ``<token>.err``: the agent's stderr (never mixed into the journal);
- ``<token>.status.json``: the supervisor's pids and, once the agent exited, its exit status
  (written atomically by the supervisor; never holds the nonce);
- ``<token>.supervisor.log``: the supervisor's own diagnostics.

Stdlib-only: the supervisor process imports it.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = ["JournalPaths", "SupervisorStatus", "encode_run_id", "read_status", "write_status"]

_PASS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-")
_MAX_TOKEN = 120


def encode_run_id(run_id: str) -> str:
    """A file-name token for ``run_id``: injective, no ``/``, never starting with ``.``.

    ``[A-Za-z0-9-]`` pass through; every other character (``_`` and ``.`` included) becomes
    ``_`` + two hex digits per UTF-8 byte. Tokens longer than 120 characters keep 103 of them
    plus ``~`` and 16 hex chars of the run id's SHA-256.
    """
    if not run_id:
        raise ValueError("run id must be a non-empty string")
    out: list[str] = []
    for ch in run_id:
        if ch in _PASS:
            out.append(ch)
        else:
            out.extend(f"_{b:02x}" for b in ch.encode("utf-8", "surrogatepass"))
    token = "".join(out)
    if len(token) > _MAX_TOKEN:
        digest = hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        token = token[: _MAX_TOKEN - 17] + "~" + digest
    return token


@dataclass(frozen=True, slots=True)
class JournalPaths:
    """The files of one run's journal, all in ``directory``."""

    directory: Path
    token: str

    @classmethod
    def for_run(cls, directory: str | os.PathLike[str], run_id: str) -> JournalPaths:
        """Paths for ``run_id`` in ``directory`` (a host-private directory)."""
        return cls(Path(directory), encode_run_id(run_id))

    @property
    def journal(self) -> Path:
        return self.directory / f"{self.token}.journal"

    @property
    def stderr(self) -> Path:
        return self.directory / f"{self.token}.err"

    @property
    def status(self) -> Path:
        return self.directory / f"{self.token}.status.json"

    @property
    def supervisor_log(self) -> Path:
        return self.directory / f"{self.token}.supervisor.log"

    @property
    def files(self) -> Path:
        """The workspace manifest at the run's start (:mod:`corral.runs._file_feed`)."""
        return self.directory / f"{self.token}.files.json"

    @property
    def baseline_git(self) -> Path:
        """A git directory holding the workspace's start state, for file diffs when the
        workspace is no git repository (:mod:`corral.runs._file_feed`)."""
        return self.directory / f"{self.token}.baseline.git"

    @property
    def usage(self) -> Path:
        """Model tokens the run's services daemon metered (:mod:`corral.agents._services`)."""
        return self.directory / f"{self.token}.usage.json"

    @property
    def services_log(self) -> Path:
        """The run's services daemon's own log."""
        return self.directory / f"{self.token}.services.log"

    @property
    def agent_state(self) -> Path:
        """A supervisor-inside run's agent state as this host last saw it, which its
        services daemon watches (:class:`corral.runs._sandbox_site.SandboxSite`)."""
        return self.directory / f"{self.token}.agent-state.json"

    def all(self) -> tuple[Path, ...]:
        """Every file a run may have here (what journal pruning removes)."""
        return (self.journal, self.stderr, self.status, self.supervisor_log, self.files,
                self.baseline_git, self.usage, self.services_log, self.agent_state)


@dataclass(frozen=True, slots=True)
class SupervisorStatus:
    """What the supervisor publishes about itself and the agent.

    ``*_start`` are the processes' start times (``/proc/<pid>/stat`` field 22) so a reused
    pid is never mistaken for ours. ``trailer_hint`` is the journal size just before the
    trailer was appended: the sentinel lies at or after it.
    """

    state: Literal["running", "exited"]
    supervisor_pid: int
    supervisor_start: int
    agent_pid: int | None
    agent_start: int | None
    exit_code: int | None = None
    signal: int | None = None
    trailer_hint: int | None = None
    spawn_error: str | None = None


def write_status(path: Path, status: SupervisorStatus) -> None:
    """Atomically replace the status file (temp file + rename)."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    data = json.dumps(asdict(status), separators=(",", ":")).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _opt_int(raw: dict[str, Any], key: str) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"status field {key} is not an integer")  # noqa: TRY004
    return value


def read_status(path: Path) -> SupervisorStatus | None:
    """Read the status file; ``None`` if it is absent or unreadable/malformed."""
    try:
        raw = json.loads(path.read_bytes())
        if not isinstance(raw, dict) or raw.get("state") not in ("running", "exited"):
            return None
        sup_pid = _opt_int(raw, "supervisor_pid")
        sup_start = _opt_int(raw, "supervisor_start")
        if sup_pid is None or sup_start is None:
            return None
        err = raw.get("spawn_error")
        return SupervisorStatus(
            state=raw["state"],
            supervisor_pid=sup_pid,
            supervisor_start=sup_start,
            agent_pid=_opt_int(raw, "agent_pid"),
            agent_start=_opt_int(raw, "agent_start"),
            exit_code=_opt_int(raw, "exit_code"),
            signal=_opt_int(raw, "signal"),
            trailer_hint=_opt_int(raw, "trailer_hint"),
            spawn_error=err if isinstance(err, str) else None,
        )
    except (OSError, ValueError):
        return None
