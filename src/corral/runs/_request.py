"""What a caller hands the Runner and gets back: :class:`RunRequest` (what to run, checked
when made), :class:`DriveResult`, and the run-level defaults and errors."""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from corral._errors import ConfigError, CorralError
from corral.sandbox._contracts import DEFAULT_PROVIDER
from corral.stores._records import RunRecord

if TYPE_CHECKING:
    # The toolset loads pydantic: a driver taking over a command run (``corral attach``)
    # never builds one.
    from corral.tools._core import Toolset

    # Imported where used for start-up cost: the sandbox definition loads the sandbox
    # machinery (ensure, bootstrap, policy), which a driver taking over a run (``corral
    # attach``) needs only when the run ends.
    from corral.sandbox._definition import Sandbox

    # The harness adapters load only for a run being started.
    from corral.harness._choice import HarnessChoice

__all__ = [
    "DEFAULT_LEASE_TTL",
    "DEFAULT_MAX_OUTPUT",
    "DriveResult",
    "RunRequest",
    "RunStartError",
    "lease_ttl_from_env",
    "max_takeovers_from",
    "new_run_id",
]

DEFAULT_LEASE_TTL = 10.0
DEFAULT_MAX_OUTPUT = 1 << 30
"""A run's default output limit (``RunRequest.max_output``): 1 GiB of journal and stderr."""


class RunStartError(CorralError):
    """The run could not be started; it was recorded as failed with this message (and the
    cause's error ``code``, when it had one, e.g. ``sandbox_gone``)."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


def max_takeovers_from(given: int | None) -> int | None:
    """The takeover limit: ``given``, else ``$CORRAL_MAX_TAKEOVERS``, else 3; ``0`` or
    ``"none"`` in the environment turns it off (``None``)."""
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, int) or given < 1:
            raise ConfigError(f"max_takeovers must be a positive integer, not {given!r}")
        return given
    raw = os.environ.get("CORRAL_MAX_TAKEOVERS")
    if raw is None or not raw.strip():
        return 3
    if raw.strip().lower() in ("0", "none", "off"):
        return None
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 1:
        raise ConfigError(f"CORRAL_MAX_TAKEOVERS must be a positive integer (or 'none'), "
                          f"got {raw!r}")
    return value


def lease_ttl_from_env() -> float:
    """``CORRAL_LEASE_TTL`` in seconds, or the default (10 s)."""
    raw = os.environ.get("CORRAL_LEASE_TTL")
    if not raw:
        return DEFAULT_LEASE_TTL
    try:
        ttl = float(raw)
    except ValueError:
        raise ConfigError(f"CORRAL_LEASE_TTL must be a number of seconds, got {raw!r}") from None
    if not 0.5 <= ttl <= 3600:
        raise ConfigError(f"CORRAL_LEASE_TTL must be between 0.5 and 3600 seconds, got {raw!r}")
    return ttl


def new_run_id() -> str:
    """A fresh run id (``run-`` and 20 hex digits)."""
    return "run-" + uuid.uuid4().hex[:20]


@dataclass(frozen=True, slots=True)
class RunRequest:
    """What to run. ``command`` is for the ``command`` harness; ``prompt`` for agent CLIs."""

    command: Sequence[str] | None = None
    prompt: str | None = None
    harness: str = "command"
    run_id: str | None = None
    thread_id: str | None = None
    provider: str = DEFAULT_PROVIDER
    workspace: str | None = None
    """A host directory copied into the sandbox's workspace (when ``sandbox`` is not given,
    or gives no source)."""
    workspace_ignore_files: bool = False
    """Leave out of that copy what its ``.gitignore`` and ``.corralignore`` files exclude,
    and ``.git`` (``corral run --workspace`` sets it unless ``--no-ignore``)."""
    env: Mapping[str, str] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    """Harness options (e.g. ``model``)."""
    sandbox: Sandbox | None = None
    """The sandbox definition. Default: a fresh ``provider`` sandbox per run, destroyed
    when the run ends, holding a copy of ``workspace``."""
    tools: Toolset | None = field(default=None, compare=False)
    """Host tools for an agent CLI (the MCP server ``corral``), served by the process that
    drives the run: pass the same toolset to :meth:`Runner.drive` (or to the
    :class:`Runner`) in every process that may drive it. Never stored."""
    frontend_tools: Sequence[Mapping[str, Any]] | None = None
    """Tools an AG-UI client runs itself (``{"name", "description", "parameters"}``,
    checked with :func:`corral.tools._frontend.check_frontend_tools`): offered to an agent
    CLI as host tools whose calls wait for the client's result. Stored in the run's spec,
    so every driver offers them."""
    timeout: float | None = None
    """Seconds the agent may run; then its supervisor, on the host and out of the agent's
    reach, stops it (SIGTERM, SIGKILL 5 s later) and the run fails with exit code 124.
    ``None``: no limit."""
    token_budget: int | None = None
    """Model tokens (input + output + cache) an agent CLI run may use; the host model proxy
    refuses further model calls once the total reaches it. ``None``: no limit."""
    output_schema: Mapping[str, Any] | None = None
    """A JSON Schema (a JSON object at the root) the run's result must match: the agent
    CLI is asked for a structured result (its own way where it has one, else the host tool
    ``submit_result``), corral validates it, gives the agent bounded retries, and stores it
    as the record's ``output`` (logged as ``CUSTOM corral.output`` before the run's end). A
    run without a valid result ends ``failed``. Agent-CLI harnesses only."""
    max_output: int = DEFAULT_MAX_OUTPUT
    """Bytes the agent may write to stdout and stderr together: its journal lives on the
    host, outside the sandbox's disk quota. Past it the supervisor stops the agent and the
    run fails saying so."""
    on_session_lost: Literal["continue", "fail"] = "continue"
    """A turn of a thread that cannot continue the thread's saved agent-CLI session (it
    is not in the store, its files are damaged, the agent refuses it): ``"continue"``
    answers the prompt in a new conversation and says so (``CUSTOM corral.session_lost``
    before the first message, a ``session_lost`` warning on the record); ``"fail"`` ends
    the run ``failed`` (code ``session_lost``) instead. See docs/threads.md."""

    def __post_init__(self) -> None:
        t = self.timeout
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float))
                              or not 0 < t < float("inf")):
            raise ConfigError(f"timeout must be a positive number of seconds, not {t!r}")
        m = self.max_output
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ConfigError(f"max_output must be a positive number of bytes, not {m!r}")
        b = self.token_budget
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 1):
            raise ConfigError(f"token_budget must be a positive integer, not {b!r}")
        if self.on_session_lost not in ("continue", "fail"):
            raise ConfigError("on_session_lost must be continue or fail, not "
                              f"{self.on_session_lost!r}")
        if b is not None and self.harness == "command":
            raise ConfigError("token_budget limits an agent CLI's model calls; the command "
                              "harness makes none")
        if self.output_schema is not None:
            if self.harness == "command":
                raise ConfigError("output_schema asks an agent CLI for a structured result; "
                                  "the command harness only prints lines: use an agent "
                                  "harness (claude-code, codex, opencode, gemini-cli, acp)")
            # start-up cost: only a run with a schema loads the validator
            from corral.tools._output import check_output_schema

            object.__setattr__(self, "output_schema", check_output_schema(self.output_schema))

    def definition(self) -> Sandbox:
        """The sandbox definition this run uses."""
        from corral.sandbox._definition import Sandbox  # start-up cost: see the imports
        from corral.sandbox._lifecycle import Lifecycle
        from corral.sandbox._sources import LocalDir

        sandbox = self.sandbox
        if sandbox is None:
            sandbox = Sandbox(provider=self.provider, lifecycle=Lifecycle(reuse="none"))
        if self.workspace is not None and sandbox.workspace.source.kind == "none":
            if not Path(self.workspace).is_dir():
                raise ConfigError(f"workspace {self.workspace!r} is not a directory")
            source = LocalDir(str(Path(self.workspace).resolve()),
                              ignore_files=self.workspace_ignore_files)
            sandbox = replace(sandbox, workspace=replace(sandbox.workspace, source=source))
        return sandbox

    def harness_choice(self, sandbox: Sandbox) -> HarnessChoice:
        """This run's harness in ``sandbox``, and what the run records of it."""
        # start-up cost: see the imports
        from corral.harness._choice import choose_harness
        from corral.policy._policy import Policy

        # Only a policy the user wrote: the default one (default "ask") cannot be enforced
        # by the agent CLIs, and without one they run with their permission prompts off,
        # confined by the sandbox.
        return choose_harness(self.harness, self.options, argv=self.command,
                              policy=sandbox.policy if sandbox.policy != Policy() else None,
                              output_schema=self.output_schema)


@dataclass(frozen=True, slots=True)
class DriveResult:
    """How a call to :meth:`Runner.drive` ended: the record as last read, and whether this
    caller stopped (detached) rather than saw the run end."""

    record: RunRecord
    detached: bool = False
