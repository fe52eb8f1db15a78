"""``corral run`` and ``corral cancel``: starting and cancelling runs through the runner
(the event stream ``run`` prints is :mod:`corral.cli._view`'s)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from corral._errors import ConfigError
from corral._ids import check_id
from corral.cli._progress import CopyProgressLine
from corral.cli._records import record_json
from corral.cli._store import with_store
from corral.cli._trust import check_found_config
from corral.cli._view import EventPrinter, follow, say
from corral.runs._runner import DEFAULT_MAX_OUTPUT, Runner, RunRequest
import corral._validate as validate
from corral.sandbox._config_file import agent_table, find_config, load_config
from corral.sandbox._contracts import DEFAULT_PROVIDER
from corral.sandbox._definition import Sandbox
from corral.sandbox._transfer import report_copy_progress
from corral.stores._protocols import Store
from corral.stores._records import RunRecord

__all__ = ["cancel", "run"]


def run(args: argparse.Namespace) -> int:
    _agent_defaults(args)
    if not args.argv:
        raise ConfigError(
            "nothing to run: give a command after --, e.g. corral run -- echo hello"
            if args.harness == "command"
            else "give the prompt, e.g. corral run --harness claude-code \"fix the test\""
        )
    # The server's rule (corral._ids): ids become file names, URLs and log fields.
    if args.run_id is not None:
        check_id(args.run_id, "--run-id")
    if args.thread is not None:
        check_id(args.thread, "--thread")
    sandbox, config_dir = _definition(args)
    workspace = args.workspace or (str(config_dir) if config_dir is not None else None)
    options = _harness_options(args)
    request = RunRequest(
        command=list(args.argv) if args.harness == "command" else None,
        prompt=None if args.harness == "command" else " ".join(args.argv),
        harness=args.harness,
        options=options,
        run_id=args.run_id,
        thread_id=args.thread,
        provider=args.provider or DEFAULT_PROVIDER,
        workspace=workspace,
        workspace_ignore_files=not args.no_ignore,
        sandbox=sandbox,
        timeout=args.timeout,
        token_budget=args.token_budget,
        output_schema=(_output_schema(args.output_schema)
                       if args.output_schema is not None else None),
        on_session_lost=args.on_session_lost,
        max_output=(validate.size(args.max_output, "--max-output")
                    if args.max_output is not None else DEFAULT_MAX_OUTPUT),
    )
    if args.file_events:
        file_events: bool | Literal["diff"] = "diff" if args.file_events == "diff" else True
        request = replace(request, sandbox=replace(request.definition(),
                                                   file_events=file_events))
    if args.max_copy_size is not None:
        defn = request.definition()
        ws = replace(defn.workspace,
                     max_copy_size=validate.size(args.max_copy_size, "--max-copy-size"))
        request = replace(request, sandbox=replace(defn, workspace=ws))
    async def start(store: Store) -> int:
        return await _start(store, args, request)

    with report_copy_progress(CopyProgressLine(sys.stderr, bar=sys.stderr.isatty())):
        return with_store(args, start)


def _output_schema(path: str) -> Any:
    """The JSON Schema in file ``path`` (``--output-schema``), read as JSON; RunRequest
    checks it."""
    from corral.tools._output import MAX_SCHEMA_BYTES  # --output-schema only: its tool stack

    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SCHEMA_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"--output-schema {path}: cannot read it: "
                          f"{exc.strerror or exc}") from None
    if len(data) > MAX_SCHEMA_BYTES:
        raise ConfigError(f"--output-schema {path}: larger than {MAX_SCHEMA_BYTES} bytes; "
                          "describe the result more briefly")
    try:
        return json.loads(data)
    except ValueError as exc:
        raise ConfigError(f"--output-schema {path}: not JSON: {exc}") from None


def _agent_defaults(args: argparse.Namespace) -> None:
    """Fill ``--harness``/``--model``/``--agent``/``--agent-command`` left out from the
    ``[agent]`` table of the run's corral.toml (the flags win; ``--agent`` and
    ``--agent-command`` replace each other)."""
    path = Path(args.config) if args.config else find_config(args.workspace or os.getcwd())
    table = agent_table(path) if path is not None and path.is_file() else {}
    if not args.config and not args.harness and table.get("harness", "command") != "command":
        # a repository's own file may not turn a command into an agent run on your key
        raise ConfigError(
            f"{path}: [agent] harness = {table['harness']!r} in a corral.toml found in the "
            f"workspace is not followed: pass --harness {table['harness']}, or name the "
            "file with --config if it is yours")
    args.harness = args.harness or table.get("harness") or "command"
    args.model = args.model or table.get("model")
    if not (getattr(args, "agent", None) or getattr(args, "agent_command", None)) \
            and args.harness == table.get("harness"):
        args.agent = table.get("agent")
        args.agent_command = table.get("agent_command")


def _harness_options(args: argparse.Namespace) -> dict[str, str]:
    """``--model``, and ``--agent`` / ``--agent-command`` for the acp harness."""
    options = {"model": args.model} if args.model else {}
    agent, command = getattr(args, "agent", None), getattr(args, "agent_command", None)
    if (agent or command) and args.harness != "acp":
        raise ConfigError("--agent and --agent-command choose an ACP agent: add --harness acp")
    if agent:
        options["agent"] = agent
    if command:
        options["agent_command"] = command
    return options


def _definition(args: argparse.Namespace) -> tuple[Sandbox | None, Path | None]:
    """The sandbox definition from ``--config`` or a ``corral.toml`` found in the workspace
    (or current) directory, and the directory holding it."""
    if args.config:
        path: Path | None = Path(args.config)
        if not path.is_file():  # type: ignore[union-attr]
            raise ConfigError(f"--config {args.config}: no such file")
    else:
        path = find_config(args.workspace or os.getcwd())
    if path is None:
        return None, None
    sandbox = load_config(path)
    if not args.config:  # the repository's own file: a request, not the host's settings
        check_found_config(sandbox, path, provider_chosen=bool(args.provider),
                           copy_limit_chosen=args.max_copy_size is not None)
    if args.provider and args.provider != sandbox.provider_name:
        sandbox = replace(sandbox, provider=args.provider, provider_config={})
    return sandbox, path.resolve().parent


async def _start(store: Store, args: argparse.Namespace, request: RunRequest) -> int:
    runner = Runner(store)
    record = await runner.start(request)
    if args.detach:
        record = await runner.detach(record.run_id)
        if args.json:
            print(json.dumps(record_json(record)))
        else:
            print(record.run_id)
        return 0
    say(f"run {record.run_id} started (thread {record.thread_id}); "
        "Ctrl-C detaches, twice cancels")
    printer = EventPrinter(args.json, line_deltas=record.harness == "command")
    return await follow(store, record.run_id, 0, printer, runner)


def cancel(args: argparse.Namespace) -> int:
    async def cancel_run(store: Store) -> RunRecord:
        return await Runner(store).cancel(args.run_id)

    record = with_store(args, cancel_run)
    if getattr(args, "json", False):
        print(json.dumps(record_json(record)))
    else:
        say(f"run {record.run_id}: {record.status.value}")
    return 0
