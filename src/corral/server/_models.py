"""Request and response bodies of the HTTP API (JSON, snake_case)."""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal
from urllib.parse import quote

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, model_validator

from corral._durations import DURATION_FORMS, parse_duration
from corral._ids import ID_PATTERN
from corral.stores._records import RunRecord, RunStatus

NAME_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


def _plain_text(value: str) -> str:
    """Text that can reach argv, files and JSON logs: no NUL, no lone surrogates."""
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode (no lone surrogates)") from None
    return value


def _duration(value: object) -> object:
    """A string duration (``"10m"``) in seconds: the one parser the CLI and the definition
    files use; a number passes through to the field's own checks."""
    if isinstance(value, str):
        return parse_duration(value, what="timeout")  # ConfigError is a ValueError
    return value


Id = Annotated[str, StringConstraints(pattern=ID_PATTERN)]
Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
Arg = Annotated[str, StringConstraints(max_length=8192), AfterValidator(_plain_text)]
Text = Annotated[str, StringConstraints(min_length=1, max_length=100_000),
                 AfterValidator(_plain_text)]
HostPath = Annotated[str, StringConstraints(min_length=1, max_length=4096),
                 AfterValidator(_plain_text)]


class SandboxIn(BaseModel):
    """An inline sandbox definition (what the server's configuration allows of it)."""

    model_config = ConfigDict(extra="forbid")

    provider: Name | None = Field(None, description="sandbox provider, e.g. bubblewrap")
    workspace: HostPath | None = Field(
        None,
        description="a host directory copied into the sandbox's workspace; only under one "
        "of the server's configured workspace roots",
    )


class StartRun(BaseModel):
    """``POST /v1/runs``: either ``command`` (the command harness) or ``prompt`` with an
    agent ``harness``."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            # Exactly one kind of run (what _one_kind checks), stated for generated clients.
            "oneOf": [
                {
                    "required": ["command"],
                    "properties": {"command": {"type": "array"},
                                   "harness": {"enum": ["command", None]}},
                    "not": {"required": ["prompt"], "properties": {"prompt": {"type": "string"}}},
                },
                {
                    "required": ["prompt", "harness"],
                    "properties": {"prompt": {"type": "string"},
                                   "harness": {"type": "string", "not": {"const": "command"}}},
                    "not": {"required": ["command"],
                            "properties": {"command": {"type": "array"}}},
                },
            ]
        },
    )

    thread_id: Id = Field(description="the conversation this run belongs to")
    run_id: Id | None = Field(None, description="caller-chosen run id (default: generated)")
    command: list[Arg] | None = Field(
        None, min_length=1, max_length=1024, description="argv of the program to run"
    )
    prompt: Text | None = Field(None, description="the prompt for an agent harness")
    harness: Name | None = Field(
        None, description="harness name; `command` (the default with `command`) or an agent"
    )
    model: Annotated[str, StringConstraints(min_length=1, max_length=200),
                     AfterValidator(_plain_text)] | None = Field(
        None, description="model for agent harnesses"
    )
    agent: Name | None = Field(
        None, description="the ACP agent of the `acp` harness (e.g. `opencode`)"
    )
    sandbox: SandboxIn | Name | None = Field(
        None,
        description="an inline sandbox definition, or the name of one configured on the "
        "server (default: the server's default sandbox)",
    )
    timeout: Annotated[float, BeforeValidator(_duration)] | None = Field(
        None, gt=0, le=7 * 86400,
        description="how long the agent may run, in seconds or as a duration string "
        f"({DURATION_FORMS}); then it is stopped and the run fails (124)",
    )
    token_budget: int | None = Field(
        None, ge=1, description="agent harnesses: model tokens the run may use"
    )
    file_events: bool | Literal["diff"] = Field(
        False, description='log workspace changes as CUSTOM sandbox.file events ("diff": '
        "with sandbox.file.diff patches)"
    )
    output_schema: dict[str, Any] | None = Field(
        None, description="agent harnesses: a JSON Schema (an object at its root) the "
        "run's result must match; the run's `output` holds it, or the run fails"
    )
    on_session_lost: Literal["continue", "fail"] = Field(
        "continue", description="agent harnesses, a turn that cannot continue its "
        "thread's saved conversation (it is not in the store, damaged, or refused by the "
        "agent): `continue` answers in a new one (CUSTOM corral.session_lost, a "
        "`session_lost` warning on the run), `fail` ends the run failed (`session_lost`)"
    )

    @model_validator(mode="after")
    def _one_kind(self) -> StartRun:
        if self.command is not None and self.prompt is not None:
            raise ValueError("give either command or prompt, not both")
        if self.command is None and self.prompt is None:
            raise ValueError("give command (an argv list) or prompt (with harness)")
        if self.command is not None:
            if not self.command[0]:
                raise ValueError("command[0] (the program) must not be empty")
            if self.harness not in (None, "command"):
                raise ValueError("command runs use the command harness; use prompt for agents")
            if self.token_budget is not None:
                raise ValueError("token_budget is for agent harnesses (prompt runs)")
            if self.output_schema is not None:
                raise ValueError("output_schema is for agent harnesses (prompt runs)")
        elif self.harness in (None, "command"):
            raise ValueError("a prompt needs an agent harness, e.g. \"harness\": \"claude-code\"")
        if self.agent is not None and self.harness != "acp":
            raise ValueError('agent names the ACP agent of "harness": "acp"')
        return self


class RunCreated(BaseModel):
    run_id: str
    thread_id: str
    status: RunStatus
    events_url: str


class ForkBody(BaseModel):
    """Fork a thread: the new thread's id, and the run after which to take its state
    (default: the thread's current state)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    as_: Id = Field(alias="as", description="the new thread's id")
    at: Id | None = Field(default=None, description="a run of the thread: fork from the "
                          "state after it")


class ThreadList(BaseModel):
    """Threads, newest activity first: ``{thread_id, runs, last_status, last_activity,
    harness, title, active_run}`` each."""

    threads: list[dict[str, Any]]


class ThreadOut(BaseModel):
    """A thread: its runs, checkpoints (the last is its current state, ``head``) and saved
    sessions."""

    thread_id: str
    runs: list[dict[str, Any]]
    checkpoints: list[dict[str, Any]]
    head: str | None = None
    sessions: list[dict[str, Any]]


class ThreadRemoved(BaseModel):
    thread_id: str
    sessions: int
    checkpoints: int
    sandboxes: int
    runs: int = 0
    """Runs removed with their logs (``?runs=true``)."""
    chunks: int = 0
    """Checkpoint chunks freed (no checkpoint names them any more)."""


class ApprovalAnswer(BaseModel):
    """A viewer's answer to a host tool's approval request."""

    model_config = ConfigDict(extra="forbid")

    decision: Literal["allow", "deny"]
    reason: str | None = Field(default=None, max_length=2000)


class ApprovalOut(BaseModel):
    """A pending approval request (as in the ``corral.approval_request`` event)."""

    approval_id: str
    run_id: str
    tool: str
    args: Any = None
    created_at: float
    expires_at: float


class ApprovalList(BaseModel):
    approvals: list[ApprovalOut]


class ApprovalResult(BaseModel):
    approval_id: str
    decision: Literal["allow", "deny"]


class HarnessUnavailable(BaseModel):
    """A harness the server allows but cannot start a run with now, and why."""

    name: str
    code: str = Field(description="the error code `POST /v1/runs` would answer "
                      "(`harness_not_installed`, `model_key_missing`, …)")
    reason: str = Field(description="what is missing and the fix, for the operator")


class HarnessList(BaseModel):
    """``GET /v1/harnesses``: the harnesses this server starts runs with."""

    harnesses: list[str] = Field(description="names `POST /v1/runs` accepts as `harness` and "
                                 "can start now (`command` for command runs)")
    default_harness: str | None = Field(
        None, description="the harness of an AG-UI input that names none")
    unavailable: list[HarnessUnavailable] = Field(
        default_factory=list, description="harnesses the server allows but cannot start "
        "now (an agent CLI not installed, a model key not set), each with the reason")
    suggested_harness: str | None = Field(
        None, description="the harness a client should preselect: the default when it can "
        "start, else one that can (an agent before `command`)")


class RunErrorOut(BaseModel):
    message: str
    code: str | None = None


class RunOut(BaseModel):
    """A run as clients see it (no journal, nonce, lease owner or sandbox internals)."""

    run_id: str
    thread_id: str
    status: RunStatus
    harness: str | None = None
    command: list[str] | None = None
    started_at: float
    updated_at: float
    finished_at: float | None = None
    exit_code: int | None = None
    error: RunErrorOut | None = None
    detached_since: float | None = None
    cancel_requested: bool = False
    driver_epoch: int = 0
    usage: dict[str, Any] | None = None
    output: dict[str, Any] | None = None
    """The run's structured result (a run started with ``output_schema``)."""
    checkpoint: dict[str, Any] | None = Field(
        default=None, description="the thread's checkpoint taken as the run ended: "
        "{id, bytes} or {skipped}/{error}")
    undone_at: float | None = Field(default=None, description="when an undo took this "
                                    "run's turn back")
    warnings: list[dict[str, Any]] | None = Field(
        default=None, description="what went wrong without failing the run, each "
        "{code, message, ...}: `session_lost` (also `harness`, `expected`) when the turn "
        "began a new conversation instead of continuing the thread's saved session")
    events_url: str

    @classmethod
    def of(cls, record: RunRecord, root: str = "") -> RunOut:
        """``record`` as the API shows it; ``root`` is the app's mount prefix (``root_path``)."""
        spec = record.spec or {}
        argv = spec.get("argv")
        command = [str(a) for a in argv] if isinstance(argv, list) else None
        return cls(
            run_id=record.run_id,
            thread_id=record.thread_id,
            status=record.status,
            harness=record.harness,
            command=command,
            started_at=record.started_at,
            updated_at=record.updated_at,
            finished_at=record.finished_at,
            exit_code=record.exit_code,
            error=(RunErrorOut(message=record.error.message, code=record.error.code)
                   if record.error else None),
            detached_since=record.detached_since,
            cancel_requested=bool(record.cancel_requested),
            driver_epoch=record.driver_epoch,
            usage=dict(record.usage) if record.usage else None,
            output=dict(record.output) if record.output is not None else None,
            checkpoint=dict(record.checkpoint) if record.checkpoint else None,
            undone_at=record.undone_at,
            warnings=[dict(w) for w in record.warnings] if record.warnings else None,
            events_url=root + events_url(record.run_id),
        )


class RunList(BaseModel):
    runs: list[RunOut]


class ErrorDetail(BaseModel):
    code: str = Field(description="machine-readable, e.g. invalid_request, not_found")
    message: str = Field(description="what was wrong and how to fix it")
    details: list[dict[str, Any]] | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail


def events_url(run_id: str) -> str:
    return f"/v1/runs/{quote(run_id, safe='')}/events"
