"""The reaper inside ``corral serve``: one sweep every ``reap_interval``, one sweeper at a time.

Each interval every server process first expires the runs it drives itself that nobody
watched for ``reap_ttl`` (only it can: it holds their claims). Then it tries the store-wide
lock ``corral.reaper``; the process that gets it runs one sweep of
:meth:`Runner.reap` (finalize, expire, reclaim, prune journals, collect idle sandboxes)
over the runs nobody drives (detached
``corral run``\\ s, runs of a server process that died), keeping the lock renewed while the
sweep lasts. The others skip the sweep until the next interval.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Final

import anyio

from corral._log import library_logger
from corral.runs._owner import new_owner_id

if TYPE_CHECKING:
    from corral.runs._reap_sweep import ReapResult
    from corral.server._service import RunService

log = library_logger("corral.server._reap_loop")

LOCK_NAME: Final = "corral.reaper"
MIN_LOCK_TTL: Final = 60.0


async def reaper_loop(service: RunService) -> None:
    """Sweep on the configured interval until cancelled."""
    owner = new_owner_id()
    while True:
        await anyio.sleep(service.config.reap_interval)
        await sweep_once(service, owner)


async def sweep_once(service: RunService, owner: str) -> ReapResult | None:
    """Expire this process's unwatched runs, then sweep under the store-wide lock.

    Returns the sweep's result, or ``None`` when another process holds the lock (or the
    sweep failed; that is logged). Never raises for a store or run failure.
    """
    config = service.config
    store = service.store
    try:
        await service.expire_unwatched(config.reap_ttl)
    except Exception as exc:  # noqa: BLE001 - next interval tries again
        log.error("expiring unwatched runs failed: %s", exc)
    lock_ttl = max(MIN_LOCK_TTL, 2 * config.reap_interval)
    try:
        if not await store.try_lock(LOCK_NAME, owner, lock_ttl):
            log.debug("another process is sweeping; skipping this interval")
            return None
    except Exception as exc:  # noqa: BLE001
        log.error("taking the reaper lock failed: %s", exc)
        return None
    result: ReapResult | None = None
    # Wall-clock stamps, so the sweeps of all hosts can be laid side by side (one at a time).
    log.info("reaper sweep by %s started at %.6f", owner, time.time())
    try:
        async with anyio.create_task_group() as tg:

            async def keep_lock() -> None:
                while True:
                    await anyio.sleep(lock_ttl / 3)
                    if not await store.try_lock(LOCK_NAME, owner, lock_ttl):
                        log.warning("the reaper lock was taken over mid-sweep")
                        return

            tg.start_soon(keep_lock)
            swept, _ = await service.runner.reap(ttl=config.reap_ttl)
            tg.cancel_scope.cancel()
        result = swept
        busy = {o.value: n for o, n in swept.outcomes.items() if n}
        if busy:
            log.info("reaper sweep: considered %d: %s", swept.considered, busy)
    except Exception as exc:  # noqa: BLE001 - a sweep never takes the server down
        log.error("reaper sweep failed: %s", exc, exc_info=exc)
    finally:
        log.info("reaper sweep by %s ended at %.6f", owner, time.time())
        with anyio.CancelScope(shield=True):
            try:
                await store.unlock(LOCK_NAME, owner)
            except Exception as exc:  # noqa: BLE001 - the lock lapses by itself
                log.warning("releasing the reaper lock failed: %s", exc)
    return result
