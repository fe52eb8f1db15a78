"""The kit machinery itself: a kit reports each check by name, a broken implementation
fails the checks it breaks, the pytest wrapper names one test per check, and the polling
helper names what it waited for."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from corral.sandbox._contracts import SandboxRef
from corral.stores import open_store
from corral.stores._protocols import Store
from corral.testing import (
    PROVIDER_KIT,
    STORE_KIT,
    CheckSkipped,
    FakeProvider,
    Kit,
    KitFailed,
    WaitTimeout,
    check_provider,
    check_store,
    pytest_checks,
    raises,
    run_kit,
    wait_until,
    wait_until_async,
)
from corral.testing._kit import check, opened

pytestmark = pytest.mark.anyio


class _CloseIgnored:
    """A store whose ``close`` reports success without closing the log."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def close(self, run_id: str, *, epoch: int | None = None) -> bool:
        return (await self.inner.get(run_id)) is not None


async def _broken_store() -> _CloseIgnored:
    return _CloseIgnored(await open_store("memory://"))


async def test_a_store_that_never_closes_fails_the_checks_that_need_close() -> None:
    with raises(KitFailed) as info:
        await check_store(_broken_store, only=[
            "close_never_fenced", "unknown_run_and_closed_log", "create_and_get_round_trip"])
    report = info.value.report
    assert set(report.failed) == {"close_never_fenced", "unknown_run_and_closed_log"}
    assert report.passed == ["create_and_get_round_trip"]  # the rest still ran
    assert "close_never_fenced" in str(info.value)
    assert "Traceback" in report.tracebacks["close_never_fenced"]


class _ForgetfulDestroy(FakeProvider):
    """``destroy`` of an unknown sandbox raises: not idempotent."""

    async def destroy(self, ref: SandboxRef | str) -> None:
        sandbox_id = ref.id if isinstance(ref, SandboxRef) else ref
        if sandbox_id not in {r.id for r in await self.list()}:
            raise KeyError(sandbox_id)
        await super().destroy(ref)


async def test_a_provider_whose_destroy_is_not_idempotent_fails_by_name() -> None:
    with raises(KitFailed) as info:
        await check_provider(_ForgetfulDestroy, posix_shell=False,
                             only=["destroy_kills_processes_removes_state_and_is_idempotent",
                                   "names"])
    assert list(info.value.report.failed) == [
        "destroy_kills_processes_removes_state_and_is_idempotent"]
    assert info.value.report.passed == ["names"]


async def test_run_kit_reports_passed_skipped_failed_and_makes_a_fresh_subject_each() -> None:
    made: list[list[str]] = []

    def factory() -> list[str]:
        made.append([])
        return made[-1]

    async def check_passes(subject: list[str]) -> None:
        subject.append("x")
        assert subject == ["x"]  # fresh: the other checks' appends are not here

    async def check_skips(subject: list[str]) -> None:
        raise CheckSkipped("not promised")

    async def check_fails(subject: list[str]) -> None:
        subject.append("y")
        assert subject == [], "boom"

    kit: Kit[list[str]] = Kit("demo", (check(check_passes), check(check_skips),
                                       check(check_fails)), subject=opened)
    report = await run_kit(kit, factory)
    assert report.passed == ["passes"]
    assert report.skipped == {"skips": "not promised"}
    assert list(report.failed) == ["fails"] and "boom" in report.failed["fails"]
    assert len(made) == 3
    with raises(ValueError, match="no check named nope"):
        await run_kit(kit, factory, only=["nope"])


def test_pytest_checks_defines_one_named_test_per_check() -> None:
    namespace: dict[str, Any] = {"__name__": "somewhere"}
    names = pytest_checks(STORE_KIT, {"memory": _broken_store}, namespace)
    assert names == [f"test_{c.name}" for c in STORE_KIT.checks]
    assert namespace[names[0]].__name__ == names[0]
    assert namespace[names[0]].__module__ == "somewhere"
    with raises(ValueError, match="already defined"):
        pytest_checks(STORE_KIT, _broken_store, namespace)
    assert len({c.name for c in PROVIDER_KIT.checks}) == len(PROVIDER_KIT.checks)


def test_raises_checks_type_and_message() -> None:
    with raises((KeyError, ValueError), match="b+") as info:
        raise ValueError("abbbc")
    assert isinstance(info.value, ValueError)
    with pytest.raises(AssertionError, match="did not raise KeyError"):
        with raises(KeyError):
            pass
    with pytest.raises(AssertionError, match="does not match"):
        with raises(KeyError, match="x"):
            raise KeyError("y")
    with pytest.raises(TypeError):  # anything else propagates untouched
        with raises(KeyError):
            raise TypeError("other")


def test_wait_until_returns_once_true_and_names_what_it_waited_for() -> None:
    start = time.monotonic()
    calls = iter(range(100))
    wait_until(lambda: next(calls) >= 3, "the third call", interval=0.001)
    with pytest.raises(WaitTimeout, match=r"timed out after 0.05s waiting for the moon"):
        wait_until(lambda: False, "the moon", timeout=0.05)
    assert time.monotonic() - start < 5


async def test_wait_until_async_takes_plain_and_async_predicates() -> None:
    flag = anyio.Event()

    async def later() -> None:
        await anyio.sleep(0.02)
        flag.set()

    async def is_set() -> bool:
        return flag.is_set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(later)
        await wait_until_async(is_set, "the flag")
    await wait_until_async(flag.is_set, "the flag again", timeout=0)
    with pytest.raises(WaitTimeout, match="waiting for never"):
        await wait_until_async(lambda: 0, "never", timeout=0.03)


class _MergingSessions:
    """A session store whose put merges files into the old session and enforces no limit,
    and whose reads may see a writer halfway (header first, files after a yield)."""

    def __init__(self) -> None:
        from corral.stores import SessionLimits

        self.session_limits = SessionLimits()
        self.heads: dict[tuple[str, str], Any] = {}
        self.files: dict[tuple[str, str], dict[str, bytes]] = {}

    async def put_session(self, session: Any) -> Any:
        key = (session.thread_id, session.harness)
        self.heads[key] = session
        await anyio.sleep(0)  # a reader may come in here: the new header, the old files
        self.files.setdefault(key, {}).update(session.files)
        return session.info()

    async def get_session(self, thread_id: str, harness: str) -> Any:
        from corral.stores import StoredSession

        head = self.heads.get((thread_id, harness))
        if head is None:
            return None
        return StoredSession(thread_id, harness, head.session_id,
                             dict(self.files.get((thread_id, harness), {})), head.saved_at,
                             head.run_id)

    async def list_sessions(self, thread_id: str) -> list[Any]:
        return [(await self.get_session(t, h)).info()
                for t, h in sorted(self.heads) if t == thread_id]

    async def delete_sessions(self, thread_id: str, harness: str | None = None) -> int:
        keys = [k for k in self.heads if k[0] == thread_id and harness in (None, k[1])]
        for k in keys:
            del self.heads[k]
        return len(keys)


async def test_a_session_store_that_merges_fails_the_checks_it_breaks() -> None:
    from corral.testing import check_session_store

    with raises(KitFailed) as info:
        await check_session_store(_MergingSessions)
    failed = set(info.value.report.failed)
    assert {"put_replaces_the_whole_session", "limits_refuse_and_write_nothing",
            "hostile_paths_are_refused", "concurrent_writers_never_mix",
            "delete_all_or_one_harness"} <= failed, info.value.report.outcomes
    assert "round_trip" in info.value.report.passed
