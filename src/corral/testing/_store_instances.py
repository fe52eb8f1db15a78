"""Store kit, what ``ensure`` keeps in a store: sandbox instance records, named locks and
corral's shared secrets."""

from __future__ import annotations

import anyio
import anyio.lowlevel

from corral.stores._protocols import InstanceRecord, Store, StoreError
from corral.testing._kit import Kit, raises
from corral.testing._store_fixtures import DEADLINE, T0

__all__ = ["INSTANCE_CHECKS"]

INSTANCE_CHECKS: Kit[Store] = Kit("store")
"""This part's checks, in the order written (the store kit joins the parts)."""


# ------------------------------------------------------------------ instance store
# Sandbox instance records.

@INSTANCE_CHECKS.add
async def check_get_upsert_delete(store: Store) -> None:
    assert await store.get_instance("k") is None
    full = InstanceRecord("k", "bubblewrap", "sb-1", "t", T0, latest_snapshot_id="snap",
                          latest_run_id="r", expires_at=T0 + 60, meta={"a": 1})
    await store.upsert_instance(full)
    assert await store.get_instance("k") == full
    bare = InstanceRecord("k", "bubblewrap", "sb-2", "t", T0 + 1)
    await store.upsert_instance(bare)  # full replace: optional fields cleared
    got = await store.get_instance("k")
    assert got == bare
    assert got is not None and "latest_snapshot_id" not in got.to_dict()
    await store.delete_instance("k")
    assert await store.get_instance("k") is None
    await store.delete_instance("k")  # missing is a no-op


@INSTANCE_CHECKS.add
async def check_list_expired_inclusive(store: Store) -> None:
    await store.upsert_instance(InstanceRecord("a", "p", "1", "t", T0, expires_at=T0 + 10))
    await store.upsert_instance(InstanceRecord("b", "p", "2", "t", T0, expires_at=T0 + 11))
    await store.upsert_instance(InstanceRecord("c", "p", "3", "t", T0))
    assert [r.key for r in await store.list_expired_instances(T0 + 10)] == ["a"]
    assert sorted(r.key for r in await store.list_expired_instances(T0 + 99)) == ["a", "b"]


# ------------------------------------------------------------------ named lock
# Lease locks for once-across-hosts work.

@INSTANCE_CHECKS.add
async def check_exclusive_until_released_or_expired(store: Store) -> None:
    assert await store.try_lock("reaper", "a", 10, now=T0)
    assert not await store.try_lock("reaper", "b", 10, now=T0 + 5)
    assert await store.try_lock("reaper", "a", 10, now=T0 + 5)  # holder extends
    assert not await store.try_lock("reaper", "b", 10, now=T0 + 14)
    assert await store.try_lock("other", "b", 10, now=T0)  # names are independent
    assert not await store.unlock("reaper", "b")
    assert await store.unlock("reaper", "a")
    assert await store.try_lock("reaper", "b", 10, now=T0 + 14)
    assert await store.try_lock("reaper", "c", 10, now=T0 + 24)  # b's lease lapsed
    assert not await store.unlock("reaper", "b")


# ------------------------------------------------------------------ shared secrets
# corral's own keys. That two store objects (hosts) on one database agree is a property of
# the backend's insert-if-absent; each backend's own tests race processes on one URL.

@INSTANCE_CHECKS.add
async def check_shared_secret_is_stable_and_per_name(store: Store) -> None:
    first = await store.shared_secret("approvals")
    assert isinstance(first, bytes) and len(first) == 32
    assert await store.shared_secret("approvals") == first
    other = await store.shared_secret("other")
    assert len(other) == 32 and other != first
    assert await store.shared_secret("approvals") == first
    with raises(StoreError):
        await store.shared_secret("")


@INSTANCE_CHECKS.add
async def check_shared_secret_first_callers_agree(store: Store) -> None:
    got: list[bytes] = []

    async def ask() -> None:
        got.append(await store.shared_secret("fresh"))

    with anyio.fail_after(DEADLINE):
        async with anyio.create_task_group() as tg:
            for _ in range(10):
                tg.start_soon(ask)
    assert len(got) == 10 and len(set(got)) == 1
