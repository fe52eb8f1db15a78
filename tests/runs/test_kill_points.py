"""The SIGKILL-then-attach property at library level: whatever step a driver dies at, the
next driver (a new claim epoch) leaves the log holding the run's full translation, each
event exactly once.

A driver is "killed" as SIGKILL would: at a chosen step it stops dead, and from then on
nothing it does reaches the store (no claim release, no terminal write, no close); its
claim stays held under the owner id of a process that is gone, so the successor breaks
that lease at once, as a takeover of a dead local driver does. The steps are the produce
path's checkpoints (:data:`corral.runs._produce.STEPS`) and the moments just before and
just after every store call the driver makes (claim acquisition and renewal, appends,
tail reads, the terminal write, the close). Drivers are the Runner's and the reaper's;
both use the one produce path.

The journals are written as the supervisor writes them (agent bytes, then the exit
trailer), so hypothesis can try many journals and kill points fast; one real SIGKILL of a
``corral run`` process stays in ``test_runner_e2e.py``.
"""

from __future__ import annotations

import functools
import secrets
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.harness._base import RunContext, translate_run
from corral.harness._events import event_to_dict
from corral.harness._registry import build_harness
from corral.journal._layout import JournalPaths
from corral.journal._sentinel import format_trailer, new_nonce
from corral.runs._claims import hold_claim
from corral.runs._owner import OwnerId, boot_id, new_owner_id, owner_is_dead
from corral.runs._pipe import pipe_to_run_log
from corral.runs._produce import STEPS
from corral.runs._reap_runner import journal_drive
from corral.runs._runner import Runner
from corral.runs._spec import RunSpec
from corral.stores._memory import MemoryStore
from corral.stores._protocols import NewRun, Store
from corral.stores._records import RunStatus

LEASE = 60.0  # long: a successor gets the run only by breaking a dead owner's lease


class Killed(BaseException):
    """The driver died here (a BaseException: no ``except Exception`` of the code under
    test may record it, as nothing records a SIGKILL)."""


class Killer:
    """Counts a driver's steps and kills it at step ``at``; dead, it touches nothing."""

    def __init__(self, at: int | None = None, *, name: str | None = None,
                 pause: float = 0.0) -> None:
        self.at = at
        self.name = name
        self.pause = pause
        self.steps = 0
        self.dead = False
        self.where = ""

    def step(self, name: str) -> None:
        if self.dead:
            raise Killed(self.where)
        if self.steps == self.at or name == self.name:
            self.dead = True
            self.where = name
            raise Killed(name)
        self.steps += 1

    async def checkpoint(self, name: str) -> None:
        assert name in STEPS
        self.step(name)
        if self.pause:
            await anyio.sleep(self.pause)  # a slow driver: its claim renewals interleave


class DyingStore:
    """A store as seen by a driver that may die: every call is a kill point before it
    runs and after it returns; once dead, no call reaches the store."""

    def __init__(self, store: Store, killer: Killer) -> None:
        self._store = store
        self._killer = killer

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if name == "read":
            return self._read
        if not callable(attr):
            return attr

        @functools.wraps(attr)
        async def call(*args: Any, **kwargs: Any) -> Any:
            self._killer.step(f"before {name}")
            result = await attr(*args, **kwargs)
            self._killer.step(f"after {name}")
            return result

        return call

    async def _read(self, run_id: str, after: int = 0) -> AsyncIterator[Any]:
        self._killer.step("read log")
        async for item in self._store.read(run_id, after):
            if self._killer.dead:
                raise Killed("read log")
            yield item


@functools.cache
def dead_pid() -> int:
    """The pid of a process that ran here and is gone (waited for)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def dead_owner() -> str:
    """The owner id of a driver process that died on this machine."""
    owner = str(OwnerId(boot_id(), dead_pid(), 1, secrets.token_hex(4)))
    assert owner_is_dead(owner)
    return owner


async def runner_driver(store: Store, run_id: str, owner: str, killer: Killer | None,
                        journals: Path, lease: float = LEASE) -> None:
    runner = Runner(store, lease_ttl=lease, journals_dir=journals)
    runner.owner = owner
    runner.checkpoint = killer.checkpoint if killer is not None else None
    await runner.drive(run_id)


async def reaper_driver(store: Store, run_id: str, owner: str, killer: Killer | None,
                        journals: Path, lease: float = LEASE) -> None:
    """The reaper's drive (``journal_drive``) under a claim, piped into the log."""
    record = await store.get(run_id)
    assert record is not None
    if record.terminal:
        return
    breaking = record.claim_owner if owner_is_dead(record.claim_owner) else None
    drive = journal_drive(store, checkpoint=killer.checkpoint if killer else None)
    async with hold_claim(store, run_id, owner, lease, break_lease_of=breaking) as held:
        abort = anyio.Event()
        current = await store.get(run_id)
        assert current is not None
        await pipe_to_run_log(store, run_id, drive(current, held.epoch, abort),
                              epoch=held.epoch, abort=abort)


DRIVERS = {"runner": runner_driver, "reaper": reaper_driver}

lines = st.lists(
    st.one_of(
        st.text(st.characters(blacklist_characters="\n", blacklist_categories=["Cs"]),
                max_size=12).map(str.encode),
        st.binary(max_size=8).map(lambda b: b.replace(b"\n", b"")),  # not always UTF-8
    ),
    max_size=8,
)


async def full_translation(paths: JournalPaths, nonce: str, run_id: str
                           ) -> list[dict[str, Any]]:
    harness = build_harness("command", {"argv": ["agent"]})
    out: list[dict[str, Any]] = []
    async for batch in translate_run(harness, RunContext(run_id, run_id), paths, nonce=nonce):
        out += [event_to_dict(e) for e in batch.events]
    return out


async def scenario(journal_lines: list[bytes], code: int, start_logged: bool,
                   kills: list[tuple[str, int]], last: str, root: Path, *,
                   killers: list[tuple[str, Killer]] | None = None,
                   lease: float = LEASE) -> list[str]:
    """Drive the run with killed drivers, then ``last``; check the property. Returns
    where each killed driver died."""
    store = MemoryStore()
    run_id, nonce = "run-kill", new_nonce()
    paths = JournalPaths.for_run(root, run_id)
    paths.journal.write_bytes(b"\n".join(journal_lines) + format_trailer(nonce, code, None))
    await store.create(NewRun(
        run_id=run_id, thread_id=run_id, harness="command",
        spec=RunSpec(argv=["agent"]).to_json(),
        journal={"dir": str(root), "nonce": nonce}))
    expected = await full_translation(paths, nonce, run_id)
    if start_logged:  # the starter logged the start batch, then went away
        async with hold_claim(store, run_id, new_owner_id(), LEASE) as held:
            start = expected[:2]  # RUN_STARTED, TEXT_MESSAGE_START: the start batch
            await store.append(run_id, [(e, 0) for e in start], epoch=held.epoch)
    died: list[str] = []
    for kind, killer in killers or [(kind, Killer(at)) for kind, at in kills]:
        try:
            await DRIVERS[kind](DyingStore(store, killer), run_id,
                                dead_owner(), killer, root, lease)
        except BaseException as exc:  # noqa: BLE001 - only the kill may end a driver
            assert killer.dead, f"driver {kind} failed without being killed: {exc!r}"
            died.append(killer.where)
    before = await store.get(run_id)
    await DRIVERS[last](store, run_id, new_owner_id(), None, root)
    if last == "reaper" and before is not None and before.terminal:
        # The reaper never touches an ended run; an attach closes a log its dead driver
        # left open after storing the end.
        await runner_driver(store, run_id, new_owner_id(), None, root)

    record = await store.get(run_id)
    assert record is not None
    assert record.status is (RunStatus.COMPLETED if code == 0 else RunStatus.FAILED)
    assert record.exit_code == code
    logged = [e.event for e in await store.snapshot(run_id)]
    assert logged == expected
    assert (await store.tail(run_id)).closed
    return died


@settings(max_examples=300, deadline=None)
@given(
    journal_lines=lines,
    code=st.sampled_from([0, 0, 1, 137]),
    start_logged=st.booleans(),
    kills=st.lists(st.tuples(st.sampled_from(sorted(DRIVERS)), st.integers(0, 40)),
                   min_size=1, max_size=3),
    last=st.sampled_from(sorted(DRIVERS)),
)
def test_any_kill_point_then_takeover_logs_the_full_translation_once(
    journal_lines: list[bytes], code: int, start_logged: bool,
    kills: list[tuple[str, int]], last: str,
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        root.chmod(0o700)
        anyio.run(scenario, journal_lines, code, start_logged, kills, last, root)


@pytest.mark.parametrize("kind", sorted(DRIVERS))
@pytest.mark.parametrize("where", ["before renew_claim", "after renew_claim"])
def test_a_kill_at_claim_renewal_then_takeover_logs_the_full_translation_once(
    kind: str, where: str
) -> None:
    """A slow driver (its renewals interleave with its batches) dies at a renewal."""
    killer = Killer(name=where, pause=0.12)
    with tempfile.TemporaryDirectory() as tmp:
        died = anyio.run(functools.partial(
            scenario, [b"one", b"two", b"three"], 0, False, [], "runner", Path(tmp),
            killers=[(kind, killer)], lease=0.3))
    assert died == [where]


def test_the_kill_points_reach_every_step_and_store_write() -> None:
    """The property test's kill points cover what the guarantee rests on: each step of the
    produce path and both sides of every claim, append, status write and close."""
    seen: set[str] = set()
    for kind in sorted(DRIVERS):
        for at in range(200):
            with tempfile.TemporaryDirectory() as tmp:
                died = anyio.run(scenario, [b"a", b"b"], 0, False, [(kind, at)], "runner",
                                 Path(tmp))
            if not died:
                break  # the driver finished before this step: every step was a kill point
            seen.update(died)
    wanted = {*STEPS, *(f"{side} {call}" for side in ("before", "after")
                        for call in ("acquire_claim", "append", "update", "close"))}
    assert wanted <= seen, sorted(wanted - seen)


def test_every_step_of_the_produce_path_is_a_kill_point() -> None:
    """The hook sees each step of each journal item, so the property test reaches them."""
    seen: list[str] = []

    async def main(root: Path) -> None:
        store = MemoryStore()
        run_id, nonce = "run-steps", new_nonce()
        paths = JournalPaths.for_run(root, run_id)
        paths.journal.write_bytes(b"a\nb" + format_trailer(nonce, 0, None))
        await store.create(NewRun(run_id=run_id, thread_id=run_id, harness="command",
                                  spec=RunSpec(argv=["agent"]).to_json(),
                                  journal={"dir": str(root), "nonce": nonce}))
        runner = Runner(store, lease_ttl=LEASE, journals_dir=root)

        async def checkpoint(name: str) -> None:
            seen.append(name)

        runner.checkpoint = checkpoint
        result = await runner.drive(run_id)
        assert result.record.status is RunStatus.COMPLETED

    with tempfile.TemporaryDirectory() as tmp:
        anyio.run(main, Path(tmp))
    # the start batch, two lines, the exit: four items, each read, translated, logged
    assert seen == list(STEPS) * 4
