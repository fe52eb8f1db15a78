"""What a client may ask to run: a request body checked against the server's
configuration (allowed harnesses, configured or inline sandboxes, workspace roots). The
HTTP API (:mod:`corral.server._routes_runs`, :mod:`corral.server._routes_agui`) and the
MCP tools (:mod:`corral.server._mcp_tools`) share it, so both refuse the same things the
same way."""

from __future__ import annotations

import os
from dataclasses import replace

from corral.runs._request import RunRequest
from corral.sandbox._contracts import DEFAULT_PROVIDER
from corral.server._config import SandboxDefinition, ServerConfig
from corral.server._models import SandboxIn, StartRun

__all__ = ["ApiError", "request_for", "resolve_sandbox"]


class ApiError(Exception):
    """A 4xx/5xx answer with a JSON error body."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def resolve_sandbox(config: ServerConfig, requested: SandboxIn | str | None) -> SandboxDefinition:
    """The sandbox a request gets: a configured one by name, the server's default, or an
    inline definition within what the configuration allows."""
    if requested is None:
        if config.default_sandbox is not None:
            return config.sandboxes[config.default_sandbox]
        requested = SandboxIn(provider=None, workspace=None)
    if isinstance(requested, str):
        found = config.sandboxes.get(requested)
        if found is None:
            names = ", ".join(sorted(config.sandboxes)) or "none are configured"
            raise ApiError(400, "unknown_sandbox",
                           f"no sandbox named {requested!r} on this server ({names})")
        return found
    provider = requested.provider or DEFAULT_PROVIDER
    if provider not in config.allowed_providers:
        raise ApiError(400, "provider_not_allowed",
                       f"provider {provider!r} is not allowed here; allowed: "
                       f"{', '.join(config.allowed_providers) or 'none'} (or name a "
                       "configured sandbox)")
    workspace = requested.workspace
    if workspace is not None:
        real = os.path.realpath(workspace)
        roots = [os.path.realpath(r) for r in config.workspace_roots]
        if not any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots):
            raise ApiError(400, "workspace_not_allowed",
                           "inline workspaces must lie under one of the server's "
                           "workspace_roots" + ("" if roots else " (none are configured)"))
        if not os.path.isdir(real):
            raise ApiError(400, "invalid_workspace", f"workspace {workspace!r} is not a directory")
        workspace = real
    return SandboxDefinition(provider=provider, workspace=workspace)


def request_for(config: ServerConfig, body: StartRun) -> RunRequest:
    """The run a ``POST /v1/runs`` body (or the MCP tool ``start_run``) asks for, within
    what ``config`` allows (:class:`ApiError` otherwise)."""
    harness = body.harness or "command"
    if config.allowed_harnesses is not None and harness not in config.allowed_harnesses:
        raise ApiError(403, "harness_not_allowed",
                       f"this server does not run the {harness!r} harness; it allows "
                       f"{', '.join(config.allowed_harnesses) or 'none'}")
    sandbox = resolve_sandbox(config, body.sandbox)
    request = RunRequest(
        command=body.command,
        prompt=body.prompt,
        harness=body.harness or "command",
        run_id=body.run_id,
        thread_id=body.thread_id,
        provider=sandbox.provider,
        workspace=sandbox.workspace,
        options={k: v for k, v in (("model", body.model), ("agent", body.agent)) if v},
        timeout=body.timeout,
        token_budget=body.token_budget,
        output_schema=body.output_schema,
        on_session_lost=body.on_session_lost,
    )
    if body.file_events:
        request = replace(request, sandbox=replace(request.definition(),
                                                   file_events=body.file_events))
    if sandbox.policy is not None:
        from corral.policy._policy import Policy  # start-up cost: only when used

        request = replace(request, sandbox=replace(request.definition(),
                                                   policy=Policy(**sandbox.policy)))
    return request
