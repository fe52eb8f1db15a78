"""Run records: validation on read, patch semantics."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.stores._records import (
    UNSET,
    CorruptRecord,
    RunError,
    RunPatch,
    RunRecord,
    RunStatus,
    is_terminal_status,
    parse_status,
)

BASE: dict[str, Any] = {
    "run_id": "r",
    "thread_id": "t",
    "status": "running",
    "started_at": 1.0,
    "updated_at": 2.0,
}


def test_terminal_set() -> None:
    assert {s for s in RunStatus if s.terminal} == {
        RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.ABORTED}
    assert not RunStatus.INTERRUPTED.terminal


@pytest.mark.parametrize("value", ["toString", "constructor", "RUNNING", "", None, 1, "done"])
def test_unknown_statuses_rejected_and_not_terminal(value: object) -> None:
    with pytest.raises(CorruptRecord):
        parse_status(value)
    assert not is_terminal_status(value)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("status", "paused"),
        ("started_at", "yesterday"),
        ("started_at", math.inf),
        ("finished_at", True),
        ("exit_code", 1.5),
        ("exit_code", True),
        ("error", {"code": "x"}),
        ("error", {"message": "m", "code": 3}),
        ("cancel_requested", "yes"),
        ("cancel_requested", 1),
        ("driver_epoch", -1),
        ("driver_epoch", "2"),
        ("usage", [1, 2]),
        ("run_id", ""),
        ("surprise", 1),
    ],
)
def test_malformed_records_rejected(field: str, value: object) -> None:
    with pytest.raises(CorruptRecord) as info:
        RunRecord.from_dict({**BASE, field: value})
    assert field in str(info.value) or "unknown fields" in str(info.value)


def test_missing_required_field_rejected() -> None:
    data = dict(BASE)
    del data["started_at"]
    with pytest.raises(CorruptRecord, match="started_at"):
        RunRecord.from_dict(data)


def test_patch_unset_clear_and_false_are_distinct() -> None:
    record = RunRecord.from_dict({**BASE, "detached_since": 5.0, "cancel_requested": True})
    assert RunPatch().changes() == {}
    cleared = RunPatch(detached_since=None).apply(record, 3.0)
    assert cleared.detached_since is None and cleared.cancel_requested is True
    falsed = RunPatch(cancel_requested=False).apply(record, 3.0)
    assert falsed.cancel_requested is False and falsed.detached_since == 5.0
    assert "cancel_requested" in falsed.to_dict()
    assert "cancel_requested" not in RunPatch(cancel_requested=None).apply(record, 3).to_dict()


def test_patch_rejects_bad_values() -> None:
    with pytest.raises(CorruptRecord, match="status"):
        RunPatch(status=None)  # type: ignore[arg-type]
    with pytest.raises(CorruptRecord, match="exit_code"):
        RunPatch(exit_code="3")  # type: ignore[arg-type]
    with pytest.raises(CorruptRecord, match="error"):
        RunPatch(error={"message": "m"})  # type: ignore[arg-type]
    assert RunPatch(status=RunStatus.FAILED).is_terminal
    assert not RunPatch(status=RunStatus.INTERRUPTED).is_terminal
    assert RunPatch().status is UNSET


times = st.floats(min_value=0, max_value=4e9, allow_nan=False)
optional = st.none()


@given(
    status=st.sampled_from(list(RunStatus)),
    started=times,
    finished=st.none() | times,
    exit_code=st.none() | st.integers(-255, 255),
    error=st.none() | st.builds(RunError, st.text(min_size=1), st.none() | st.text()),
    detached=st.none() | times,
    cancel=st.none() | st.booleans(),
    epoch=st.integers(0, 2**31),
    usage=st.none() | st.dictionaries(st.text(), st.integers()),
)
def test_records_round_trip(
    status: RunStatus,
    started: float,
    finished: float | None,
    exit_code: int | None,
    error: RunError | None,
    detached: float | None,
    cancel: bool | None,
    epoch: int,
    usage: dict[str, int] | None,
) -> None:
    record = RunRecord(
        run_id="r", thread_id="t", status=status, started_at=started, updated_at=started,
        finished_at=finished, exit_code=exit_code, error=error, detached_since=detached,
        cancel_requested=cancel, driver_epoch=epoch, usage=usage,
    )
    data = record.to_dict()
    assert all(v is not None for v in data.values())
    assert RunRecord.from_dict(data) == record
