"""Keeping an agent-CLI run's services daemon (model and egress proxies) alive while a
driver holds the run."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import anyio
import anyio.to_thread

from corral._errors import CorralError
from corral._log import library_logger
from corral.agents._services import run_proxy_token, start_services
from corral.journal._layout import JournalPaths
from corral.journal._supervisor import process_alive
from corral.net._model_proxy import Upstream
from corral.runs._site import AgentSite
from corral.runs._spec import run_spec_of
from corral.stores._protocols import Store, UnknownRun
from corral.stores._records import RunPatch, RunRecord

__all__ = ["is_services_daemon", "keep_services"]

log = library_logger("corral.runs._runner")

SERVICES_CHECK: Final = 0.5
"""How often a driver checks that its run's services daemon is alive."""


async def keep_services(store: Store, record: RunRecord, site: AgentSite,
                        epoch: int) -> None:
    """While the caller holds the run (claim ``epoch``): if the run's services daemon dies
    while the agent runs, start another on the same sockets. The agent's forwarder retries
    a refused socket for a while, so its model calls go on; the new daemon continues the
    usage count (and so the budget) from the usage file."""
    info = run_spec_of(record).agent or {}
    job, pid = info.get("services"), info.get("services_pid")
    if not isinstance(job, Mapping) or not isinstance(pid, int):
        return
    while True:
        await anyio.sleep(SERVICES_CHECK)
        if is_services_daemon(pid):
            continue
        if not await site.agent_running():
            return  # the agent is done: the daemon exited as it should
        try:
            pid = await _restart(store, record, site.paths, job, epoch,
                                 await site.services_watch())
        except CorralError as exc:
            log.error("run %s: its services daemon died and could not be restarted: %s",
                      record.run_id, exc)
            return


async def _restart(store: Store, record: RunRecord, paths: JournalPaths,
                   job: Mapping[str, Any], epoch: int, watch: Path | None = None) -> int:
    up = dict(job["upstream"])
    key = Upstream.from_env(up["api"]).api_key  # this host's key for the same API
    # the run's token, derived again (the agent holds it; it is stored nowhere)
    token = await run_proxy_token(store, record.run_id)
    full = {**job, "upstream": {**up, "api_key": key}, "token": token}
    if watch is not None:  # this host's note, not the one of the host that recorded the job
        full["status"] = str(watch)
    pending = await anyio.to_thread.run_sync(
        lambda: start_services(full, paths.directory, paths.token))
    services = await anyio.to_thread.run_sync(pending.ready)
    log.warning("run %s: its services daemon had died; restarted it (pid %d)",
                record.run_id, services.pid)
    current = await store.get(record.run_id)
    if current is None:
        raise UnknownRun(record.run_id)
    spec = run_spec_of(current).with_agent(services_pid=services.pid)
    await store.update(record.run_id, RunPatch(spec=spec.to_json()), expect_epoch=epoch)
    return services.pid


def is_services_daemon(pid: int) -> bool:
    """``pid`` is alive and still a corral services daemon (not a reused pid)."""
    if not process_alive(pid):
        return False
    try:
        return b"corral.agents._services" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
