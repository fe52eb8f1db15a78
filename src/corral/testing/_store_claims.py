"""Store kit, driver claims: leases, epochs, refusals (the fencing a takeover relies on)."""

from __future__ import annotations


from corral.stores._protocols import ClaimLost, ClaimRefused, RefusalReason, Store
from corral.stores._records import RunPatch, RunStatus
from corral.testing._kit import Kit, raises
from corral.testing._store_fixtures import T0, new_run

__all__ = ["CLAIM_CHECKS"]

CLAIM_CHECKS: Kit[Store] = Kit("store")
"""This part's checks, in the order written (the store kit joins the parts)."""


# ------------------------------------------------------------------ claims
# Leases, epochs and refusals.

@CLAIM_CHECKS.add
async def check_claims_bump_the_epoch(store: Store) -> None:
    await new_run(store, "r")
    c1 = await store.acquire_claim("r", "a", 10, now=T0)
    assert c1.epoch == 1 and c1.expires_at == T0 + 10
    await store.release_claim(c1)
    rec = await store.get("r")
    assert rec is not None and rec.driver_epoch == 1 and rec.claim_owner is None
    c2 = await store.acquire_claim("r", "b", 10, now=T0 + 1)
    assert c2.epoch == 2
    rec = await store.get("r")
    assert rec is not None and (rec.claim_owner, rec.driver_epoch) == ("b", 2)


@CLAIM_CHECKS.add
async def check_refused_claim_changes_nothing(store: Store) -> None:
    """Every refusal reason, each on its own run: the refusal names it, nothing changes."""
    for reason in RefusalReason:
        run_id = f"r-{reason.name.lower()}"
        if reason is not RefusalReason.UNKNOWN:
            await new_run(store, run_id)
            await store.update(run_id, RunPatch(detached_since=T0 + 1))
        if reason is RefusalReason.TERMINAL:
            await store.update(run_id, RunPatch(status=RunStatus.FAILED))
        elif reason is RefusalReason.CANCELLED:
            await store.request_cancel(run_id)
        elif reason is RefusalReason.HELD:
            await store.acquire_claim(run_id, "holder", 30, now=T0)
        before = await store.get(run_id)
        with raises(ClaimRefused) as info:
            await store.acquire_claim(run_id, "me", 30, now=T0 + 10, clear_detached=True)
        assert info.value.reason is reason, (reason, info.value.reason)
        assert "driver claim not acquired" in str(info.value)
        assert await store.get(run_id) == before, reason


@CLAIM_CHECKS.add
async def check_cancelled_run_claimable_for_finalizing(store: Store) -> None:
    await new_run(store, "r")
    await store.request_cancel("r")
    claim = await store.acquire_claim("r", "reaper", 5, now=T0, allow_cancelled=True)
    assert claim.epoch == 1


@CLAIM_CHECKS.add
async def check_interrupted_is_claimable(store: Store) -> None:
    await new_run(store, "r")
    await store.update("r", RunPatch(status=RunStatus.INTERRUPTED))
    assert (await store.acquire_claim("r", "a", 5, now=T0)).epoch == 1


@CLAIM_CHECKS.add
async def check_expired_lease_can_be_taken_over(store: Store) -> None:
    await new_run(store, "r")
    await store.acquire_claim("r", "a", 10, now=T0)
    with raises(ClaimRefused):
        await store.acquire_claim("r", "b", 10, now=T0 + 9.9)
    taken = await store.acquire_claim("r", "b", 10, now=T0 + 10)  # expiry is inclusive
    assert taken.epoch == 2


@CLAIM_CHECKS.add
async def check_break_lease_only_of_the_named_owner(store: Store) -> None:
    await new_run(store, "r")
    await store.acquire_claim("r", "dead-driver", 30, now=T0)
    with raises(ClaimRefused) as info:
        await store.acquire_claim("r", "b", 10, now=T0 + 1, break_lease_of="someone-else")
    assert info.value.reason is RefusalReason.HELD
    taken = await store.acquire_claim("r", "b", 10, now=T0 + 1, break_lease_of="dead-driver")
    assert taken.epoch == 2
    # the broken owner is fenced: its appends no longer land
    with raises(ClaimLost):
        await store.append("r", [({"type": "CUSTOM"}, 0)], epoch=1)


@CLAIM_CHECKS.add
async def check_renew_and_loss(store: Store) -> None:
    await new_run(store, "r")
    a = await store.acquire_claim("r", "a", 10, now=T0)
    a = await store.renew_claim(a, 10, now=T0 + 8)
    assert a.expires_at == T0 + 18
    with raises(ClaimRefused):
        await store.acquire_claim("r", "b", 10, now=T0 + 15)
    b = await store.acquire_claim("r", "b", 10, now=T0 + 18)
    with raises(ClaimLost) as info:
        await store.renew_claim(a, 10, now=T0 + 18.5)
    assert (info.value.held_epoch, info.value.observed_epoch) == (1, 2)
    await store.release_claim(a)  # stale release must not drop b's lease
    rec = await store.get("r")
    assert rec is not None and rec.claim_owner == "b"
    await store.release_claim(b)
    with raises(ClaimLost):
        await store.renew_claim(b, 10)


@CLAIM_CHECKS.add
async def check_claim_can_clear_detached_since(store: Store) -> None:
    await new_run(store, "r")
    await store.update("r", RunPatch(detached_since=T0 + 1, sandbox_key="k"))
    c = await store.acquire_claim("r", "a", 5, now=T0 + 2)
    rec = await store.get("r")
    assert rec is not None and rec.detached_since == T0 + 1
    await store.release_claim(c)
    await store.acquire_claim("r", "b", 5, now=T0 + 3, clear_detached=True)
    rec = await store.get("r")
    assert rec is not None and rec.detached_since is None and rec.sandbox_key == "k"
