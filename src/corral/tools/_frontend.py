"""Frontend tools: tools an AG-UI client declares (``RunAgentInput.tools``) and runs itself.

The agent sees each as a host tool of the run's MCP server ``corral``. A call is held like
an approval (:meth:`corral.tools._approvals.Approvals.hold`): the request is stored under
``frontend:<name>`` (so any host sharing the store can answer it) and announced as
``CUSTOM corral.frontend_call`` ``{approvalId, runId, tool, args, expiresAt, toolCallId}``
(``toolCallId``: the agent's own id of the call, when its CLI names it, else absent and the
``approvalId`` stands for it). The AG-UI endpoint ends the client's stream there; the
client runs the tool and sends its result in a ``tool`` message of the next input, which
:func:`answer_frontend_call` stores as the answer (``allow`` with the content; ``deny``
with the client's error). The call then returns that content to the agent; no answer
within the gate's timeout is a tool error the agent sees (``CUSTOM
corral.frontend_call_resolved`` ``{approvalId, decision, reason}`` logs every outcome).

Descriptors (``{"name", "description", "parameters"}``, as AG-UI spells a tool) are kept in
the run's spec, so every driver of the run, on any host, offers the same tools.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from corral.stores._protocols import ApprovalAnswer, UnknownApproval
from corral.tools._approvals import FRONTEND_PREFIX, Approvals, ApprovalChannel
from corral.tools._core import NAME_RE, ToolContext, ToolError
from corral.tools._remote import ToolTimeoutError

__all__ = [
    "FRONTEND_CALL_EVENT",
    "FRONTEND_RESOLVED_EVENT",
    "FrontendCallError",
    "FrontendTool",
    "answer_frontend_call",
    "check_frontend_tools",
    "frontend_tools",
]

FRONTEND_CALL_EVENT = "corral.frontend_call"
FRONTEND_RESOLVED_EVENT = "corral.frontend_call_resolved"
MAX_DESCRIPTION = 4096
MAX_TOOLS = 64


class FrontendCallError(ToolError):
    """A frontend tool's result was refused (unknown call, already answered)."""


@dataclass(frozen=True, slots=True)
class FrontendTool:
    """One frontend tool (:class:`corral.tools._core.ToolLike`): its calls wait for the
    AG-UI client's result through ``gate``."""

    name: str
    description: str
    input_schema: dict[str, Any]
    gate: Approvals
    approval: bool = False
    waits_for_approvals: bool = True
    """Bounded by the gate's timeout, not the server's per-call timeout: the client's user
    may take longer than a tool."""

    async def run(self, args: Any, context: ToolContext | None = None) -> Any:
        # Only the agent's own id of the call: the client saw the call under it. Without
        # one (a CLI that does not name its calls) the endpoint shows corral's own.
        call_id = context.tool_use_id if context is not None else None
        announce: dict[str, Any] = {"tool": self.name}
        if call_id is not None:
            announce["toolCallId"] = call_id
        _id, answer = await self.gate.hold(
            FRONTEND_PREFIX + self.name, args, call_id=call_id,
            events=(FRONTEND_CALL_EVENT, FRONTEND_RESOLVED_EVENT), announce=announce)
        if answer.decision == "allow":
            return answer.reason or ""
        if answer.decision == "timeout":
            raise ToolTimeoutError(f"frontend tool {self.name!r}: the AG-UI client sent no "
                                   f"result ({answer.reason}); the run goes on without it")
        raise ToolError(f"frontend tool {self.name!r} failed in the client: "
                        f"{answer.reason or 'no reason given'}")


def check_frontend_tools(tools: Iterable[Mapping[str, Any]], reserved: Iterable[str]
                         ) -> list[dict[str, Any]]:
    """Descriptors for the run's spec from AG-UI tools (``name``, ``description``,
    ``parameters``). Raises :class:`ValueError` naming the first tool corral cannot offer: a
    name the agent's tool names cannot carry, a duplicate, a name in ``reserved`` (corral's
    own host tools: a client's tool never shadows one), a schema that is not an object."""
    out: list[dict[str, Any]] = []
    taken = set(reserved)
    for t in tools:
        name = t.get("name")
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise ValueError(f"tool name {str(name)[:60]!r} cannot be offered to the agent: "
                             "use 1-48 letters, digits, '_' or '-'")
        if name in taken:
            raise ValueError(f"tool {name!r} is named like one of corral's own tools or "
                             "another tool of the input; rename it")
        taken.add(name)
        description = t.get("description") or ""
        if not isinstance(description, str) or len(description) > MAX_DESCRIPTION:
            raise ValueError(f"tool {name!r}: the description must be a string of at most "
                             f"{MAX_DESCRIPTION} characters")
        schema = t.get("parameters")
        if schema is None or schema == {}:
            schema = {"type": "object", "properties": {}}
        if not isinstance(schema, Mapping) or schema.get("type") != "object":
            raise ValueError(f"tool {name!r}: parameters must be a JSON object schema "
                             '({"type": "object", ...})')
        out.append({"name": name, "description": description, "parameters": dict(schema)})
    if len(out) > MAX_TOOLS:
        raise ValueError(f"{len(out)} tools: corral offers at most {MAX_TOOLS} frontend tools "
                         "to one run")
    return out


def frontend_tools(descriptors: Iterable[Mapping[str, Any]], gate: Approvals
                   ) -> list[FrontendTool]:
    """The tools a run's spec describes, waiting on ``gate``."""
    return [FrontendTool(d["name"], d.get("description") or "", dict(d["parameters"]), gate)
            for d in descriptors]


async def answer_frontend_call(store: ApprovalChannel, run_id: str, approval_id: str,
                               content: str, *, error: str | None = None) -> bool:
    """Store the client's result of a pending frontend call (``error``: the client says
    the tool failed). Returns ``False`` when the call was answered already (a repeated
    input: the first answer stands); raises :class:`FrontendCallError` for a call the
    store does not have."""
    got = await store.get_approval(run_id, approval_id)
    if got is None or not got[0].tool.startswith(FRONTEND_PREFIX):
        raise FrontendCallError(f"no frontend tool call {approval_id!r} in run {run_id!r}")
    if got[1] is not None:
        return False
    answer = (ApprovalAnswer("deny", error, time.time()) if error is not None
              else ApprovalAnswer("allow", content, time.time()))
    try:
        standing = await store.answer_approval(run_id, approval_id, answer)
    except UnknownApproval:
        raise FrontendCallError(f"no frontend tool call {approval_id!r} in run {run_id!r}"
                                ) from None
    return standing == answer
