"""What a run needs to show its host-tool MCP server to an agent CLI in the sandbox.

The server listens on ``<net dir>/tools-<run token>.sock`` on the host; the sandbox sees
the net dir at ``/run/corral`` and the in-sandbox entry forwards
``127.0.0.1:{corral.port.tools}`` to it. The CLI is given an HTTP MCP server ``corral`` at
``http://127.0.0.1:{corral.port.tools}/mcp`` whose ``Authorization`` header is
``Bearer ${CORRAL_TOOLS_TOKEN}``: the CLI expands the variable itself (Claude Code expands
``${VAR}`` in MCP server configs; the Codex harness turns the header into
``bearer_token_env_var = "CORRAL_TOOLS_TOKEN"``), so the token travels in the CLI's
environment only, never in argv and never in a workspace file.

Wiring (for :func:`corral.agents._prepare.prepare_agent` / the Runner)::

    token = await run_tools_token(store, run_id)
    proj = host_tools_projection(net_host_dir, sock_dir_inside, run_id, token=token)
    server = HostToolServer(toolset, token=token, run_id=run_id, approvals=gate)
    options["forward"] = [*forward, proj.forward]          # next to "model"/"egress"
    options["mcp_servers"] = {**options.get("mcp_servers", {}), **proj.mcp_servers}
    request = dataclasses.replace(request, env={**request.env, **proj.env})
    # services(): await tg.start(server.serve, proj.socket)
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.stores._protocols import SecretStore
from corral.tools._keys import corral_key, derive_token
from corral.tools._names import MCP_PATH, SERVER_NAME

__all__ = ["TOKEN_ENV", "HostToolsProjection", "host_tools_projection", "run_tools_token"]

TOKEN_ENV = "CORRAL_TOOLS_TOKEN"
FORWARD_NAME = "tools"


@dataclass(frozen=True, slots=True)
class HostToolsProjection:
    """Socket path (host), forwarder entry, MCP server option and env for one run."""

    socket: Path
    """Where :meth:`HostToolServer.serve` listens on the host."""
    forward: dict[str, Any]
    """An entry for the ``forward`` agent option (the in-sandbox entry's forwarders)."""
    mcp_servers: dict[str, dict[str, Any]]
    """For the ``mcp_servers`` agent option (no secret in it)."""
    env: dict[str, str] = field(repr=False)
    """For the CLI's environment (carries the token)."""
    token: str = field(repr=False)


async def run_tools_token(store: SecretStore, run_id: str) -> str:
    """The bearer token of run ``run_id``'s host-tool server, derived from corral's key
    (``CORRAL_SECRET`` or the store's: :mod:`corral.tools._keys`): a driver that takes the
    run over, on any host sharing the store, serves with the token the agent already has,
    and the token is stored nowhere (not in the run's record, argv or workspace)."""
    return derive_token(await corral_key(store), "corral-tools-token", run_id)


def host_tools_projection(net_host_dir: Path, sock_dir_inside: str, run_id: str, *,
                          token: str | None = None) -> HostToolsProjection:
    """The projection of run ``run_id``'s host-tool server. ``net_host_dir`` is the run's
    socket directory on the host, ``sock_dir_inside`` the same directory as the sandbox
    sees it (``/run/corral`` for isolated providers). Names derive from the run id, so a
    host taking the run over serves on the same path."""
    tag = hashlib.sha256(run_id.encode()).hexdigest()[:12]
    tok = token or secrets.token_urlsafe(32)
    name = f"tools-{tag}.sock"
    return HostToolsProjection(
        socket=net_host_dir / name,
        forward={"name": FORWARD_NAME, "port": 0, "unix": f"{sock_dir_inside}/{name}",
                 # the CLI lists the server's tools once, at its start: a driver must serve
                 "await": True},
        mcp_servers={SERVER_NAME: {
            "type": "http",
            "url": "http://127.0.0.1:{corral.port." + FORWARD_NAME + "}" + MCP_PATH,
            "headers": {"Authorization": "Bearer ${" + TOKEN_ENV + "}"},
        }},
        env={TOKEN_ENV: tok},
        token=tok,
    )
