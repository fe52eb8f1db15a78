"""Property tests: interleavings of writers claiming, appending and losing leases.

Invariants: offsets are gap-free and increasing; every acknowledged event is in the log and
nothing unacknowledged is; no event from a stale epoch follows a newer epoch's events.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from contextlib import AbstractContextManager
from typing import Any

import anyio
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from corral.stores._protocols import Claim, ClaimLost, ClaimRefused, NewRun, RefusalReason, Store
from corral.stores import open_store
from tests.helpers import drop_postgres_schema, postgres_schema

T0 = 1_700_000_000.0
TTL = 10.0
WRITERS = st.sampled_from(["a", "b", "c"])


class FencingMachine(RuleBasedStateMachine):
    url_kind = "memory"

    def __init__(self) -> None:
        super().__init__()
        # asyncio only: hypothesis drives the store from its own thread through a portal;
        # the same claims and fencing run on trio in the store kit (tests/stores/conftest.py).
        self._portal_cm: AbstractContextManager[BlockingPortal] = start_blocking_portal("asyncio")
        self.portal = self._portal_cm.__enter__()
        self.tmp = tempfile.mkdtemp(prefix="corral-prop-")
        self.schema: str | None = None
        if self.url_kind == "postgres":
            self.schema, url = postgres_schema()
        else:
            url = "memory://" if self.url_kind == "memory" else f"sqlite://{self.tmp}/p.db"
        self.store: Store = self.portal.call(open_store, url)
        self.call(self.store.create, NewRun("r", "t", started_at=T0))
        self.now = T0
        self.claims: dict[str, Claim] = {}
        self.epoch = 0
        self.lease: tuple[str, float] | None = None  # the current epoch's live lease
        self.acked: list[dict[str, Any]] = []

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        async def run() -> Any:
            return await fn(*args, **kwargs)

        return self.portal.call(run)

    def lease_live(self) -> bool:
        return self.lease is not None and self.lease[1] > self.now

    @rule(writer=WRITERS)
    def claim(self, writer: str) -> None:
        try:
            claim = self.call(self.store.acquire_claim, "r", writer, TTL, now=self.now)
        except ClaimRefused as exc:
            assert exc.reason is RefusalReason.HELD and self.lease_live()
            return
        assert not self.lease_live()
        assert claim.epoch == self.epoch + 1
        self.epoch = claim.epoch
        self.claims[writer] = claim
        self.lease = (writer, claim.expires_at)

    @rule(writer=WRITERS, n=st.integers(1, 4))
    def append(self, writer: str, n: int) -> None:
        held = self.claims.get(writer)
        epoch = held.epoch if held else 0
        events = [{"type": "X", "w": writer, "epoch": epoch, "i": len(self.acked) + k}
                  for k in range(n)]
        try:
            offsets = self.call(
                self.store.append, "r", [(e, e["i"]) for e in events], epoch=epoch)
        except ClaimLost:
            assert epoch != self.epoch or epoch == 0
            return
        assert epoch == self.epoch and epoch > 0
        assert offsets == list(range(len(self.acked) + 1, len(self.acked) + n + 1))
        self.acked.extend(events)

    @rule(writer=WRITERS)
    def renew(self, writer: str) -> None:
        held = self.claims.get(writer)
        if held is None:
            return
        current = self.lease is not None and self.lease[0] == writer and held.epoch == self.epoch
        try:
            renewed = self.call(self.store.renew_claim, held, TTL, now=self.now)
        except ClaimLost:
            assert not current
            return
        assert current
        self.claims[writer] = renewed
        self.lease = (writer, renewed.expires_at)

    @rule(writer=WRITERS)
    def release(self, writer: str) -> None:
        held = self.claims.get(writer)
        if held is None:
            return
        self.call(self.store.release_claim, held)
        if self.lease is not None and self.lease[0] == writer and held.epoch == self.epoch:
            self.lease = None

    @rule(dt=st.floats(0, 2 * TTL))
    def time_passes(self, dt: float) -> None:
        self.now += dt  # leases lapse: their holders lose them to the next claim

    @invariant()
    def log_is_exactly_the_acknowledged_events(self) -> None:
        snap = self.call(self.store.snapshot, "r")
        assert [e.offset for e in snap] == list(range(1, len(snap) + 1))
        assert [e.event for e in snap] == self.acked
        epochs = [e.event["epoch"] for e in snap]
        assert epochs == sorted(epochs)
        record = self.call(self.store.get, "r")
        assert record.driver_epoch == self.epoch

    def teardown(self) -> None:
        try:
            self.call(self.store.aclose)
        finally:
            self._portal_cm.__exit__(None, None, None)
            shutil.rmtree(self.tmp, ignore_errors=True)
            if self.schema is not None:
                drop_postgres_schema(self.schema)


class SQLiteFencingMachine(FencingMachine):
    url_kind = "sqlite"


class PostgresFencingMachine(FencingMachine):
    url_kind = "postgres"


TestMemoryFencing = FencingMachine.TestCase
TestMemoryFencing.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestSQLiteFencing = SQLiteFencingMachine.TestCase
TestSQLiteFencing.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestPostgresFencing = PostgresFencingMachine.TestCase
TestPostgresFencing.settings = settings(
    max_examples=25, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.anyio
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_concurrent_writers_on_separate_connections(tmp_path: Any, backend: str) -> None:
    """Real concurrency: three connections race claims and appends on one SQLite file or
    PostgreSQL schema."""
    schema: str | None = None
    if backend == "postgres":
        schema, url = postgres_schema()
    else:
        url = f"sqlite://{tmp_path / 'race.db'}"
    stores = [await open_store(url) for _ in range(3)]
    await stores[0].create(NewRun("r", "t"))
    acked: list[dict[str, Any]] = []

    async def writer(name: str, store: Store) -> None:
        for round_ in range(6):
            # Each claim pretends the previous lease has lapsed, so claims keep stealing.
            try:
                claim = await store.acquire_claim("r", name, 1.0, now=time.time() + 10 * round_ + 5)
            except ClaimRefused:
                continue
            for k in range(15):
                event = {"type": "X", "w": name, "epoch": claim.epoch, "k": k}
                try:
                    await store.append("r", [(event, k)], epoch=claim.epoch)
                except ClaimLost:
                    break
                acked.append(event)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for i, store in enumerate(stores):
                tg.start_soon(writer, f"w{i}", store)
    snap = await stores[0].snapshot("r")
    assert [e.offset for e in snap] == list(range(1, len(snap) + 1))
    logged = [e.event for e in snap]
    assert sorted(map(repr, logged)) == sorted(map(repr, acked))
    epochs = [e["epoch"] for e in logged]
    assert epochs == sorted(epochs)
    assert len(set(epochs)) >= 2
    for s in stores:
        await s.aclose()
    if schema is not None:
        drop_postgres_schema(schema)
