"""A driver's side of host tools and approvals: serving the run's toolset on its tool
socket while the driver holds the run, and logging approval requests (and other events
that come from no journal line) into the run's log."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio.abc

from corral._errors import CorralError
from corral._log import library_logger
from corral.runs._spec import run_spec_of
from corral.stores._protocols import EventLog, Store
from corral.stores._records import RunRecord

if TYPE_CHECKING:
    from corral.sandbox._redact import Redactor
    from ag_ui.core import BaseEvent

    from corral.tools._core import Toolset
    from corral.tools._output import OutputState

__all__ = ["append_aside", "serve_tools"]

log = library_logger("corral.runs._runner")


async def append_aside(store: EventLog, run_id: str, events: Sequence[Mapping[str, Any]],
                       epoch: int) -> None:
    """Log events that come from no journal line (approval requests, file events) at the
    highest journal offset logged (the store keeps the maximum): a successor resumes the
    journal after it, so they are neither repeated nor in the way of the agent's events."""
    tail = await store.tail(run_id)
    await store.append(
        run_id, [(e, tail.last_journal_offset or 0) for e in events], epoch=epoch)


async def serve_tools(tg: anyio.abc.TaskGroup, store: Store, record: RunRecord,
                      tools: Toolset | None, epoch: int, *, approval_timeout: float,
                      redactor: Redactor | None = None,
                      after_journal: Callable[[], Awaitable[object]] | None = None,
                      output: OutputState | None = None) -> None:
    """Serve the run's host tools in ``tg`` (the caller's claimed section), if it has a
    tool socket. Approval requests and answers live in ``store`` (any host sharing it can
    answer); their events go into the run's log under ``epoch``. ``redactor`` (the run's
    secrets) is applied to both: a call's arguments are the agent's, and may carry a
    secret's value."""
    spec = run_spec_of(record)
    socket_path = (spec.agent or {}).get("tools_socket")
    if not isinstance(socket_path, str):
        return
    prompt = spec.permission_prompt and spec.policy is not None
    from corral.tools._core import Toolset  # pydantic: only for a run with a tool socket

    if tools is None and (prompt or spec.frontend_tools or output is not None):
        tools = Toolset()  # the permission prompt and a client's tools need no toolset
    if tools is None:
        log.warning("run %s was started with host tools, and this driver has none: its "
                    "tool calls fail until a driver with the toolset takes it",
                    record.run_id)
        return
    # The MCP server (and its SDK) loads only for a run that has host tools; so do the
    # approvals, the permission prompt and the policy (they load the AG-UI models and httpx:
    # start-up cost of ``corral attach``).
    from corral.harness._events import event_to_dict
    from corral.policy._policy import Policy
    from corral.tools._approvals import Approvals
    from corral.tools._mcp_server import HostToolServer
    from ag_ui.core import CustomEvent

    from corral.tools._frontend import frontend_tools
    from corral.tools._output import SUBMIT_TOOL, SubmitResultTool
    from corral.tools._permission import POLICY_DENIED_EVENT, PermissionPromptTool
    from corral.tools._projection import run_tools_token

    run_id = record.run_id

    async def emit(event: BaseEvent) -> None:
        doc = event_to_dict(event)
        if redactor:
            doc = redactor.redact_obj(doc)
        if after_journal is not None:
            await after_journal()
        try:
            await append_aside(store, run_id, [doc], epoch)
        except CorralError as exc:
            log.warning("run %s: cannot log %s: %s", run_id,
                        getattr(event, "name", event.type), exc)

    gate = Approvals(store, run_id, emit=emit, timeout=approval_timeout,
                     redact=redactor.redact_obj if redactor else None)
    async def denied(value: dict[str, Any]) -> None:
        await emit(CustomEvent(name=POLICY_DENIED_EVENT, value=value))

    if prompt and spec.policy is not None:
        tools = Toolset([*tools, PermissionPromptTool(Policy(**spec.policy), gate, denied)])
    if spec.frontend_tools:
        # the endpoint refused names that shadow corral's own; a tool added to the
        # application since is kept and the client's of that name is not offered
        tools = Toolset([*tools, *(t for t in frontend_tools(spec.frontend_tools, gate)
                                   if t.name not in tools)])
    if output is not None:
        # corral's own: an application tool of that name is not offered
        tools = Toolset([*(t for t in tools if t.name != SUBMIT_TOOL),
                         SubmitResultTool(output)])
    server = HostToolServer(tools, token=await run_tools_token(store, run_id), run_id=run_id,
                            approvals=gate)
    await tg.start(server.serve, socket_path)
