"""``corral acp``: corral as an ACP agent on stdio, for editors (Zed and every ACP client).

Each editor session is a corral thread, each prompt a durable run (:func:`request_factory`);
the protocol is :mod:`corral.server._acp_agent`'s. What a user reads about it is ``corral
acp --help`` (:func:`corral.cli._arguments.acp_arguments`).
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import replace
from pathlib import Path

import anyio

from corral._errors import ConfigError
from corral.cli._trust import check_found_config
from corral.runs._request import RunRequest
from corral.sandbox._config_file import agent_table, find_config, load_config
from corral.sandbox._contracts import DEFAULT_PROVIDER
from corral.sandbox._definition import Sandbox
from corral.sandbox._lifecycle import Lifecycle
from corral.server._acp_agent import RequestFactory, SessionRequest, serve_stdio
from corral.server._config import ServerConfig
from corral.server._service import RunService
from corral.server._sse import encode_event

__all__ = ["acp", "request_factory"]


def request_factory(args: argparse.Namespace) -> RequestFactory:
    """The run of each prompt: ``--harness`` in the sandbox ``--config`` defines (or the
    session directory's own corral.toml, checked as a repository's request), on the
    session's thread, with a copy of the session's directory as its workspace."""
    config = Path(args.config) if args.config else None
    if config is not None and not config.is_file():
        raise ConfigError(f"--config {args.config}: no such file")
    table = agent_table(config) if config is not None else {}
    harness = args.harness or table.get("harness") or "claude-code"
    options = {"model": args.model or table.get("model")} if (
        args.model or table.get("model")) else {}
    agent = args.agent or (table.get("agent") if harness == table.get("harness") else None)
    if agent:
        if harness != "acp":
            raise ConfigError("--agent chooses an ACP agent: add --harness acp")
        options["agent"] = agent
    mine = load_config(config) if config is not None else None

    def make(session: SessionRequest) -> RunRequest:
        sandbox = mine
        if sandbox is None:
            found = find_config(session.cwd)
            if found is not None:
                sandbox = load_config(found)
                check_found_config(sandbox, found, provider_chosen=bool(args.provider))
        if sandbox is None:
            # the thread keeps its sandbox: the next prompt finds the files as this one
            # left them
            sandbox = Sandbox(provider=args.provider or DEFAULT_PROVIDER,
                              lifecycle=Lifecycle(reuse="thread"))
        elif args.provider and args.provider != sandbox.provider_name:
            sandbox = replace(sandbox, provider=args.provider, provider_config={})
        if not args.no_file_events and not sandbox.file_events:
            sandbox = replace(sandbox, file_events="diff")
        command = harness == "command"
        return RunRequest(
            command=["sh", "-c", session.prompt] if command else None,
            prompt=None if command else session.prompt,
            harness=harness, options=options, thread_id=session.thread_id,
            provider=sandbox.provider_name, workspace=session.cwd,
            workspace_ignore_files=True, sandbox=sandbox)

    return make


def acp(args: argparse.Namespace) -> int:
    make = request_factory(args)
    logging.getLogger("corral").info("corral acp: speaking ACP on stdio")
    service = RunService(ServerConfig(store_url=args.store, reaper=False), encode_event)
    anyio.run(serve_stdio, service, make)
    return 0
