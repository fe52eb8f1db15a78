"""Holding a claim while driving a run.

``async with hold_claim(store, run_id, owner, ttl) as held:`` takes the lease (bumping
``driver_epoch``), renews it in the background, and cancels the body the moment the lease is
lost (a newer epoch exists, or renewals kept failing until the lease would lapse). On a loss
the block raises :class:`~corral.stores._protocols.ClaimLost` after the body has unwound; fenced
writes inside the body use ``held.epoch``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio

from corral._log import library_logger
from corral.stores._protocols import Claim, ClaimLost, ClaimStore

log = library_logger("corral.runs._claims")


@dataclass
class HeldClaim:
    """A claim in force: the latest lease and, once it is gone, why."""

    claim: Claim
    lost: ClaimLost | None = None

    @property
    def run_id(self) -> str:
        return self.claim.run_id

    @property
    def epoch(self) -> int:
        return self.claim.epoch

    def check(self) -> None:
        """Raise the :class:`ClaimLost` that ended this claim, if any."""
        if self.lost is not None:
            raise self.lost


async def _keep_renewed(
    store: ClaimStore,
    held: HeldClaim,
    ttl: float,
    interval: float,
    body: anyio.CancelScope,
    clock: Callable[[], float],
) -> None:
    while True:
        await anyio.sleep(interval)
        try:
            held.claim = await store.renew_claim(held.claim, ttl)
            continue
        except ClaimLost as exc:
            held.lost = exc
        except Exception as exc:  # a store blip is not a loss while the lease still holds  # noqa: BLE001
            if clock() + interval < held.claim.expires_at:
                log.warning("renewing claim on run %s failed, retrying: %s", held.run_id, exc)
                continue
            held.lost = ClaimLost(held.run_id, held.epoch, "lease-lost")
        body.cancel()
        return


@asynccontextmanager
async def hold_claim(
    store: ClaimStore,
    run_id: str,
    owner: str,
    ttl: float,
    *,
    renew_every: float | None = None,
    clear_detached: bool = False,
    allow_cancelled: bool = False,
    break_lease_of: str | None = None,
    clock: Callable[[], float] = time.time,
) -> AsyncIterator[HeldClaim]:
    """Acquire a claim, keep it renewed, and cancel the body if it is lost.

    Raises :class:`~corral.stores._protocols.ClaimRefused` before the body runs if the claim is
    refused (nothing changed), and :class:`~corral.stores._protocols.ClaimLost` after the body if
    the lease was lost while it ran. The lease is released on a normal exit.
    ``renew_every`` defaults to a third of ``ttl``.
    """
    claim = await store.acquire_claim(
        run_id,
        owner,
        ttl,
        clear_detached=clear_detached,
        allow_cancelled=allow_cancelled,
        break_lease_of=break_lease_of,
    )
    held = HeldClaim(claim)
    interval = renew_every if renew_every is not None else ttl / 3
    body_error: BaseException | None = None
    try:
        async with anyio.create_task_group() as tg:
            body = anyio.CancelScope()
            tg.start_soon(_keep_renewed, store, held, ttl, interval, body, clock)
            try:
                with body:
                    yield held
            except BaseException as exc:  # noqa: BLE001
                # Re-raised below, outside the task group, so it is not wrapped in a group.
                body_error = exc
            finally:
                tg.cancel_scope.cancel()
    finally:
        if held.lost is None:
            with anyio.CancelScope(shield=True):
                try:
                    await store.release_claim(held.claim)
                except Exception as exc:  # the lease simply expires later  # noqa: BLE001
                    log.warning("releasing claim on run %s failed: %s", run_id, exc)
    if body_error is not None:
        if isinstance(body_error, ClaimLost) and held.lost is None:
            held.lost = body_error
        raise body_error
    held.check()
