"""A read-only view of a run's spec that does not load pydantic for the spec corral writes.

Every driver reads ``record.spec`` (the harness to rebuild, the sandbox's secrets, file
events, host tools). :class:`~corral.runs._spec.RunSpec` is a pydantic model, and loading
pydantic and building that model is a good part of the start-up of ``corral attach``
taking over a command run (issue #17). The spec corral itself writes is the canonical v1
form: known fields only, each of its exact JSON type. :func:`spec_view` checks that form in
plain Python and returns a :class:`SpecView` of it; anything else (a v0 spec, an unknown
field, a value of another type, even one pydantic would coerce) goes through
:meth:`RunSpec.parse`, so a spec is accepted, converted or refused exactly as the model
does (``tests/runs/test_specview.py`` checks both ways agree).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from corral.harness._base import Harness
from corral.harness._registry import build_harness, registration
from corral.stores._records import RunRecord

__all__ = ["SpecView", "check_harness", "harness_for_record", "spec_view"]


def _is_str_dict(value: object) -> bool:
    return type(value) is dict and all(type(k) is str for k in value)


def _is_str_list(value: object) -> bool:
    return type(value) is list and all(type(v) is str for v in value)


def _opt(check: Any) -> Any:
    return lambda value: value is None or check(value)


# Field -> (check of the canonical value, default). The fields and types of RunSpec.
_FIELDS: dict[str, tuple[Any, Any]] = {
    "version": (lambda v: type(v) is int and v == 1, 1),
    "harness_options": (_is_str_dict, None),  # None: a fresh {} per view
    "argv": (_opt(_is_str_list), None),
    "sandbox": (_opt(_is_str_dict), None),
    "secret_names": (_is_str_list, None),  # None: a fresh [] per view
    "policy": (_opt(_is_str_dict), None),
    "permission_prompt": (lambda v: type(v) is bool, False),
    "files": (_opt(_is_str_dict), None),
    "trace": (_opt(lambda v: _is_str_dict(v) and all(type(x) is str for x in v.values())),
              None),
    "frontend_tools": (_opt(lambda v: type(v) is list and all(_is_str_dict(t) for t in v)),
                       None),
    "output_schema": (_opt(_is_str_dict), None),
    "agent": (_opt(_is_str_dict), None),
    "harness_package": (_opt(_is_str_dict), None),
}


class SpecView:
    """The fields of a run's spec (as :class:`~corral.runs._spec.RunSpec` has them), read
    only. Its containers are copies: changing them changes no record."""

    __slots__ = tuple(_FIELDS)

    version: int
    harness_options: dict[str, Any]
    argv: list[str] | None
    sandbox: dict[str, Any] | None
    secret_names: list[str]
    policy: dict[str, Any] | None
    permission_prompt: bool
    files: dict[str, Any] | None
    trace: dict[str, str] | None
    frontend_tools: list[dict[str, Any]] | None
    output_schema: dict[str, Any] | None
    agent: dict[str, Any] | None
    harness_package: dict[str, Any] | None

    def __init__(self, values: Mapping[str, Any]) -> None:
        for name, (_, default) in _FIELDS.items():
            value = values.get(name, default)
            if name == "harness_options" and value is None:
                value = {}
            elif name == "secret_names" and value is None:
                value = []
            elif type(value) is dict:
                value = dict(value)  # shallow, as the model's validation copies
            elif type(value) is list:
                value = [dict(v) if type(v) is dict else v for v in value]
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"SpecView is read-only (setting {name!r})")

    def as_dict(self) -> dict[str, Any]:
        """Every field by name (for comparisons)."""
        return {name: getattr(self, name) for name in _FIELDS}

    def harness_config(self) -> dict[str, Any]:
        """As :meth:`RunSpec.harness_config`: the options, plus what the run decided for the
        harness (command, policy, permission prompt), which wins over an option."""
        out = dict(self.harness_options)
        if self.argv is not None:
            out["argv"] = list(self.argv)
        if self.policy is not None:
            out["policy"] = dict(self.policy)
        if self.permission_prompt:
            out["permission_prompt"] = True
        if self.output_schema is not None:
            out["output_schema"] = dict(self.output_schema)
        return out


def _canonical(data: Mapping[str, Any]) -> bool:
    if data.get("version") is None:  # v0 (or no version): migrated by the model
        return False
    for name, value in data.items():
        field = _FIELDS.get(name)
        if field is None or not field[0](value):
            return False
    return True


def spec_view(record: RunRecord) -> SpecView:
    """The spec of ``record``: accepted, converted or refused (:class:`ConfigError`, one
    line naming the run) exactly as :func:`corral.runs._spec.run_spec_of` does."""
    data = record.spec
    if data is None:
        return SpecView({})
    if type(data) is dict and _canonical(data):
        return SpecView(data)
    from corral.runs._spec import run_spec_of  # pydantic: only for a spec off the fast path

    return SpecView(run_spec_of(record).model_dump())


def harness_for_record(record: RunRecord) -> Harness:
    """The harness a run was started with, rebuilt from its record (name and spec);
    :class:`~corral.harness._registry.HarnessNotInstalled` (one line naming the package
    the run recorded) where it is not installed."""
    spec = spec_view(record)
    return build_harness(record.harness or "command", spec.harness_config(),
                         recorded=spec.harness_package)


def check_harness(record: RunRecord) -> None:
    """Raise :class:`~corral.harness._registry.HarnessNotInstalled` if the harness of
    ``record`` is not installed in this process (the check a driver makes before it claims
    the run: one that cannot translate its journal must leave it as it is)."""
    registration(record.harness or "command", recorded=spec_view(record).harness_package)
