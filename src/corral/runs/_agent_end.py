"""The end of an agent-CLI run on any host, whatever its outcome: save the CLI session for
the thread's next prompt while the sandbox is still there (and record on the run which
session it ended in, and whether that was not the one it was to continue), and meter the
run's model usage (what its model proxy counted) into the record."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from corral._errors import ConfigError, CorralError
from corral._log import library_logger
from corral.harness._base import NeedsAgentRuntime
from corral.journal._supervisor import process_alive
from corral.runs._pricing import load_prices, price_usage
from corral.runs._session_lost import record_lost, refused
from corral.runs._site import AgentSite
from corral.runs._spec import harness_for_record, run_spec_of
from corral.sandbox._contracts import Handle, Provider
from corral.sandbox._redact import Redactor
from corral.stores._protocols import Store
from corral.stores._records import RunPatch, RunRecord
from corral.tools._projection import TOKEN_ENV, run_tools_token

__all__ = ["finish_agent"]

log = library_logger("corral.runs._runner")


async def finish_agent(store: Store, record: RunRecord, site: AgentSite | None, *,
                       provider_for: Callable[[str], Provider],
                       redactor: Redactor | None) -> None:
    """Finish an agent-CLI run (nothing for other harnesses): wait for its services daemon
    to write its last usage, save the session, record the usage."""
    if record.harness in (None, "command"):
        return
    try:
        harness = harness_for_record(record)
    except CorralError as exc:
        log.warning("run %s: cannot rebuild its harness: %s", record.run_id, exc)
        return
    if not isinstance(harness, NeedsAgentRuntime):
        return
    # Imported here, not at the top, so that the end of a command run (``corral attach``
    # drives one to its end) never loads the agent-CLI stack (sessions, model proxy, httpx).
    from corral.agents._prepare import finish_agent_run
    from corral.agents._services import PROXY_TOKEN_NAME, run_proxy_token
    from corral.harness._cli_base import CliHarness

    if not isinstance(harness, CliHarness):
        return  # sessions and usage are kept for corral's agent-CLI harnesses only

    spec = run_spec_of(record)
    info = spec.agent or {}
    pid = info.get("services_pid")
    paths, nonce = (site.paths, site.nonce) if site is not None else (None, None)
    if site is not None:
        await site.note_exited()  # this host's services daemon learns the agent's end
    if isinstance(pid, int):
        # The daemon writes its last usage as the agent exits, then stops.
        with anyio.move_on_after(3):
            while process_alive(pid):
                await anyio.sleep(0.05)
    resumed, own = info.get("resumed_session"), info.get("own_net_dir")
    # The run's tokens (derived again, stored nowhere) are its secrets too: the agent may
    # have printed its environment into the session.
    redactor = redactor if redactor is not None else Redactor()
    redactor.add(PROXY_TOKEN_NAME, await run_proxy_token(store, record.run_id))
    if info.get("tools_socket"):
        redactor.add(TOKEN_ENV, await run_tools_token(store, record.run_id))
    # an agent that refused the session it was given (the run failed for it) leaves the
    # store's copy as it is: the next turn knows not to give it that session again
    not_taken = refused(record)
    report = await finish_agent_run(
        harness, await _sandbox(record, provider_for), record.thread_id, paths, nonce,
        # saved in the store, where the thread's next turn finds it on any host
        sessions=None if not_taken else store, run_id=record.run_id,
        # the saved CLI session can hold whatever the agent printed
        redactor=redactor,
        secret_names=list(spec.secret_names),
        resumed_session=resumed if isinstance(resumed, str) else None,
        # (an ACP run that failed on it reports no session of its own)
        sockets=[Path(p) for p in info.get("sockets") or [] if isinstance(p, str)],
        own_net_dir=Path(own) if isinstance(own, str) else None,
    )
    for error in report.errors:
        log.warning("run %s: %s", record.run_id, error)
    if report.session_id is not None:
        # the conversation the thread is in after this turn: what its next turn must
        # continue (runs/_session_lost.py), whichever host runs it
        session = {"harness": harness.name,
                   "id": resumed if not_taken and isinstance(resumed, str)
                   else report.session_id}
        await store.update(record.run_id, RunPatch(spec=spec.with_agent(
            session=session).to_json()))
        await record_lost(store, record, report.session_id)
    if paths is not None and report.usage.requests:
        u = report.usage
        usage: dict[str, Any] = {
            "input_tokens": u.input_tokens, "output_tokens": u.output_tokens,
            "cache_read_tokens": u.cache_read_tokens,
            "cache_write_tokens": u.cache_write_tokens,
            "total_tokens": u.total, "requests": u.requests, "refused": u.refused,
            "models": u.models,
        }
        try:
            usage.update(price_usage(u.models, load_prices()))
        except ConfigError as exc:  # the operator's price file: the tokens still count
            log.warning("run %s: no cost: %s", record.run_id, exc)
        await store.update(record.run_id, RunPatch(usage=usage))


async def _sandbox(record: RunRecord, provider_for: Callable[[str], Provider]
                   ) -> Handle | None:
    ref = record.sandbox_ref or {}
    name, sandbox_id = ref.get("provider"), ref.get("id")
    if not isinstance(name, str) or not isinstance(sandbox_id, str):
        return None
    try:
        return await provider_for(name).resume(sandbox_id)
    except CorralError as exc:
        log.warning("run %s: its sandbox is unreachable: %s", record.run_id, exc)
        return None
