"""Run records, their status set and patches.

Timestamps are float epoch seconds everywhere (``time.time()``). Records are immutable; a
change is a :class:`RunPatch` applied by a store. Records read from a store pass through
:meth:`RunRecord.from_dict`, which rejects unknown statuses and malformed values instead of
guessing (a mis-read status can delete a live run's journal or resurrect a finished one).
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Final, TypeVar, Union

from corral._errors import CorralError


class RunStatus(enum.StrEnum):
    """Where a run is. ``interrupted`` is a pause, not an end."""

    RUNNING = "running"
    INTERRUPTED = "interrupted"
    COMPLETED = "completed"
    FAILED = "failed"
    ABORTED = "aborted"

    @property
    def terminal(self) -> bool:
        """True for completed, failed and aborted: nothing more will be appended."""
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES: Final = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.ABORTED})


def parse_status(value: object) -> RunStatus:
    """The :class:`RunStatus` named by ``value``; anything else raises :class:`CorruptRecord`."""
    if isinstance(value, str):
        for status in RunStatus:
            if status.value == value:
                return status
    raise CorruptRecord(f"unknown run status {value!r}; expected one of "
                        f"{', '.join(s.value for s in RunStatus)}")


def is_terminal_status(value: object) -> bool:
    """True only for a terminal status; an unrecognised value is *not* terminal."""
    return isinstance(value, str) and value in {s.value for s in TERMINAL_STATUSES}


class CorruptRecord(CorralError, ValueError):
    """A stored value could not be read as a valid record (names the field and the value)."""


@dataclass(frozen=True, slots=True)
class RunError:
    """Why a run failed: a message for people and an optional machine-branchable code."""

    message: str
    code: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"message": self.message}
        if self.code is not None:
            out["code"] = self.code
        return out

    @classmethod
    def from_dict(cls, value: object) -> RunError:
        if not isinstance(value, Mapping) or not isinstance(value.get("message"), str):
            raise CorruptRecord(f"run error must be an object with a string message, got {value!r}")
        code = value.get("code")
        if code is not None and not isinstance(code, str):
            raise CorruptRecord(f"run error code must be a string, got {code!r}")
        return cls(message=value["message"], code=code)


class _Unset(enum.Enum):
    UNSET = "UNSET"

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = _Unset.UNSET
"""Default of every :class:`RunPatch` field: leave the stored value alone."""

_T = TypeVar("_T")
Patch = Union[_T, None, _Unset]  # noqa: UP007 (a generic alias needs Union on 3.11)
"""A patch value: ``UNSET`` leaves the field alone, ``None`` clears it, anything else sets it."""


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One run. Field names are the ``corral show --json`` keys.

    ``driver_epoch`` is 0 until the first claim; only claims change it. ``claim_owner`` is
    who holds the lease (``None`` once it is released); ``claim_expires_at`` is when the
    latest lease ends or ended (a release sets it to the release time; ``None`` only for a
    run never claimed), so a lapsed lease still says since when nobody drives the run.
    """

    run_id: str
    thread_id: str
    status: RunStatus
    started_at: float
    updated_at: float
    finished_at: float | None = None
    exit_code: int | None = None
    error: RunError | None = None
    usage: Mapping[str, Any] | None = None
    sandbox_key: str | None = None
    sandbox_ref: Mapping[str, Any] | None = None
    harness: str | None = None
    spec: Mapping[str, Any] | None = None
    journal: Mapping[str, Any] | None = None
    detached_since: float | None = None
    cancel_requested: bool | None = None
    driver_epoch: int = 0
    claim_owner: str | None = None
    claim_expires_at: float | None = None
    output: Mapping[str, Any] | None = None
    """The run's structured result (a run started with an output schema): the JSON object
    the agent gave, validated against that schema; at most :data:`MAX_OUTPUT_BYTES` as
    JSON."""
    checkpoint: Mapping[str, Any] | None = None
    """The thread's checkpoint taken as the run ended (#27): ``{"id", "bytes"}``, or
    ``{"skipped": why}`` / ``{"error": why}`` when none was recorded."""
    undone_at: float | None = None
    """When ``corral threads undo`` took this run's turn back (it stays in the history)."""
    takeovers: Mapping[str, Any] | None = None
    """Drivers that took the run over without it making progress: ``{"count", "offset"}``
    (the log's offset when the count last grew); see ``Runner(max_takeovers=)``."""
    output_tries: Mapping[str, Any] | None = None
    """A run with an output schema: the results the agent gave that did not match it,
    ``{"invalid": n, "error": the last validation error}``, counted for the run across
    its drivers (a takeover continues the count; written fenced by the driver's claim)."""
    warnings: Sequence[Mapping[str, Any]] | None = None
    """What went wrong without failing the run, each ``{"code", "message", ...}``: e.g.
    ``session_lost`` (the turn was to continue the thread's saved CLI session and began
    a new conversation; also ``expected``, the session id it was to continue). At most
    :data:`MAX_WARNINGS`."""

    @property
    def terminal(self) -> bool:
        return self.status.terminal

    def lease_live(self, now: float) -> bool:
        """True while someone holds an unexpired lease on this run."""
        return (
            self.claim_owner is not None
            and self.claim_expires_at is not None
            and self.claim_expires_at > now
        )

    @property
    def unattended_since(self) -> float | None:
        """Since when nobody watches or drives this run: ``detached_since`` when a viewer
        left, else the end of its latest lease (a driver that died without detaching, at
        any moment, leaves a lease that lapses). ``None`` for a run never claimed. While a
        lease is live this is in the future, so a cutoff at or before now never selects
        it. What :meth:`~corral.stores._protocols.RunStore.list_reclaimable` selects on."""
        if self.detached_since is not None:
            return self.detached_since
        return self.claim_expires_at

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict; fields that are ``None`` are omitted (absent, not null)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if isinstance(value, RunError):
                value = value.to_dict()
            elif isinstance(value, RunStatus):
                value = value.value
            elif isinstance(value, Mapping):
                value = dict(value)
            elif f.name == "warnings":
                value = [dict(w) for w in value]
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunRecord:
        """Validate and build a record; raises :class:`CorruptRecord` naming the bad field."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise CorruptRecord(f"run record has unknown fields {sorted(unknown)}")
        run_id = data.get("run_id")
        try:
            kwargs: dict[str, Any] = {
                "run_id": _req_str(data, "run_id"),
                "thread_id": _req_str(data, "thread_id"),
                "status": parse_status(data.get("status")),
                "started_at": _req_time(data, "started_at"),
                "updated_at": _req_time(data, "updated_at"),
                "finished_at": _opt_time(data, "finished_at"),
                "exit_code": _opt_int(data, "exit_code"),
                "error": None if data.get("error") is None else RunError.from_dict(data["error"]),
                "usage": _opt_obj(data, "usage"),
                "sandbox_key": _opt_str(data, "sandbox_key"),
                "sandbox_ref": _opt_obj(data, "sandbox_ref"),
                "harness": _opt_str(data, "harness"),
                "spec": _opt_obj(data, "spec"),
                "journal": _opt_obj(data, "journal"),
                "detached_since": _opt_time(data, "detached_since"),
                "cancel_requested": _opt_bool(data, "cancel_requested"),
                "driver_epoch": _opt_int(data, "driver_epoch") or 0,
                "claim_owner": _opt_str(data, "claim_owner"),
                "claim_expires_at": _opt_time(data, "claim_expires_at"),
                "output": _opt_output(data, "output"),
                "checkpoint": _opt_obj(data, "checkpoint"),
                "undone_at": _opt_time(data, "undone_at"),
                "takeovers": _opt_obj(data, "takeovers"),
                "output_tries": _opt_obj(data, "output_tries"),
                "warnings": _opt_warnings(data, "warnings"),
            }
        except CorruptRecord as exc:
            raise CorruptRecord(f"run {run_id!r}: {exc}") from None
        if kwargs["driver_epoch"] < 0:
            raise CorruptRecord(f"run {run_id!r}: driver_epoch must be >= 0")
        return cls(**kwargs)


_PATCHABLE: Final = (
    "status",
    "finished_at",
    "exit_code",
    "error",
    "usage",
    "sandbox_key",
    "sandbox_ref",
    "harness",
    "spec",
    "journal",
    "detached_since",
    "cancel_requested",
    "output",
    "checkpoint",
    "undone_at",
    "takeovers",
    "output_tries",
    "warnings",
)


@dataclass(frozen=True, slots=True)
class RunPatch:
    """A partial update. ``UNSET`` (the default) leaves a field alone; ``None`` clears it.

    ``cancel_requested=False`` is a value, distinct from ``None`` (cleared). ``status`` cannot
    be cleared. ``driver_epoch`` and the lease are not patchable: only claims change them.
    """

    status: RunStatus | _Unset = UNSET
    finished_at: Patch[float] = UNSET
    exit_code: Patch[int] = UNSET
    error: Patch[RunError] = UNSET
    usage: Patch[Mapping[str, Any]] = UNSET
    sandbox_key: Patch[str] = UNSET
    sandbox_ref: Patch[Mapping[str, Any]] = UNSET
    harness: Patch[str] = UNSET
    spec: Patch[Mapping[str, Any]] = UNSET
    journal: Patch[Mapping[str, Any]] = UNSET
    detached_since: Patch[float] = UNSET
    cancel_requested: Patch[bool] = UNSET
    output: Patch[Mapping[str, Any]] = UNSET
    checkpoint: Patch[Mapping[str, Any]] = UNSET
    undone_at: Patch[float] = UNSET
    takeovers: Patch[Mapping[str, Any]] = UNSET
    output_tries: Patch[Mapping[str, Any]] = UNSET
    warnings: Patch[Sequence[Mapping[str, Any]]] = UNSET

    def __post_init__(self) -> None:
        status: object = self.status
        if status is None:
            raise CorruptRecord("a run patch cannot clear status; omit it to leave it alone")
        if status is not UNSET:
            parse_status(status)
        for name, check in _PATCH_CHECKS.items():
            value = getattr(self, name)
            if value is UNSET or value is None:
                continue
            try:
                check({name: value}, name)
            except CorruptRecord as exc:
                raise CorruptRecord(f"invalid run patch: {exc}") from None

    def changes(self) -> dict[str, Any]:
        """Named fields only: ``{field: value or None-for-clear}``."""
        out: dict[str, Any] = {}
        for name in _PATCHABLE:
            value = getattr(self, name)
            if value is not UNSET:
                out[name] = value
        return out

    @property
    def is_terminal(self) -> bool:
        return isinstance(self.status, RunStatus) and self.status.terminal

    def apply(self, record: RunRecord, now: float) -> RunRecord:
        """The record with this patch applied (and ``updated_at`` set to ``now``)."""
        changes = self.changes()
        if isinstance(changes.get("status"), str):
            changes["status"] = parse_status(changes["status"])
        return replace(record, updated_at=float(now), **changes)


def _req_str(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise CorruptRecord(f"{key} must be a non-empty string, got {value!r}")
    return value


def _opt_str(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise CorruptRecord(f"{key} must be a string, got {value!r}")
    return value


def _req_time(data: Mapping[str, Any], key: str) -> float:
    value = _opt_time(data, key)
    if value is None:
        raise CorruptRecord(f"{key} is required")
    return value


def _opt_time(data: Mapping[str, Any], key: str) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise CorruptRecord(f"{key} must be epoch seconds (a finite number), got {value!r}")
    return float(value)


def _opt_int(data: Mapping[str, Any], key: str) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise CorruptRecord(f"{key} must be an integer, got {value!r}")
    return value


def _opt_bool(data: Mapping[str, Any], key: str) -> bool | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise CorruptRecord(f"{key} must be true or false, got {value!r}")
    return value


def _opt_obj(data: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise CorruptRecord(f"{key} must be a JSON object, got {type(value).__name__}")
    return value


MAX_OUTPUT_BYTES: Final = 256 * 1024
"""The largest structured result a run record keeps (``RunRecord.output``, as JSON)."""


def output_size(value: object) -> int:
    """The size of ``value`` as compact JSON (UTF-8 bytes); raises :class:`CorruptRecord`
    for a value JSON cannot hold (NaN, a non-string key, an object of another type)."""
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise CorruptRecord(f"output must be JSON: {exc}") from None
    return len(text.encode("utf-8", "surrogatepass"))


def _opt_output(data: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    value = _opt_obj(data, key)
    if value is not None and output_size(value) > MAX_OUTPUT_BYTES:
        raise CorruptRecord(f"{key} is larger than {MAX_OUTPUT_BYTES} bytes as JSON")
    return value


MAX_WARNINGS: Final = 20
"""The most warnings a run record keeps."""


def _opt_warnings(data: Mapping[str, Any], key: str) -> tuple[Mapping[str, Any], ...] | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
        raise CorruptRecord(f"{key} must be a list of objects, got {type(value).__name__}")
    if len(value) > MAX_WARNINGS:
        raise CorruptRecord(f"{key} holds more than {MAX_WARNINGS} warnings")
    for item in value:
        if not isinstance(item, Mapping) or not isinstance(item.get("code"), str) \
                or not isinstance(item.get("message"), str):
            raise CorruptRecord(f"{key} must hold objects with a code and a message")
    return tuple(value)


def _check_error(data: Mapping[str, Any], key: str) -> None:
    if not isinstance(data[key], RunError):
        raise CorruptRecord(f"{key} must be a RunError, got {data[key]!r}")


_PATCH_CHECKS: Final = {
    "finished_at": _opt_time,
    "exit_code": _opt_int,
    "error": _check_error,
    "usage": _opt_obj,
    "sandbox_key": _opt_str,
    "sandbox_ref": _opt_obj,
    "harness": _opt_str,
    "spec": _opt_obj,
    "journal": _opt_obj,
    "detached_since": _opt_time,
    "cancel_requested": _opt_bool,
    "output": _opt_output,
    "checkpoint": _opt_obj,
    "undone_at": _opt_time,
    "takeovers": _opt_obj,
    "output_tries": _opt_obj,
    "warnings": _opt_warnings,
}


def record_from_json(text: str) -> RunRecord:
    """Parse and validate a stored run record (raises ``CorruptRecord``)."""

    try:
        data = json.loads(text)
    except ValueError:
        raise CorruptRecord("a stored run record is not valid JSON") from None
    if not isinstance(data, dict):
        raise CorruptRecord("a stored run record is not a JSON object")
    return RunRecord.from_dict(data)
