"""The run spec: what a run's record carries so that any process can continue the run, and
the run's harness rebuilt from it.

A run's state passes from its starter to every successor (an attaching driver, a takeover,
the reaper) through ``record.spec``. The store keeps it as a JSON object; this module gives
it a type and a schema version, so a harness option can never be mistaken for the run's own
fields and a record written by another corral version is read or refused, never misread.

Versions:

- **v0** (records written before the spec had a version): one flat object, the harness
  options merged at its top level with the run's fields (``sandbox``, ``argv``, ``files``,
  ``agent``, ...). It has no integer ``version`` (a *string* ``version`` there is the agent
  CLI's version, a harness option). Read by migration: the run's known fields are taken
  out, everything else is a harness option.
- **v1**: ``{"version": 1, "harness_options": {...}, ...}``, the fields of :class:`RunSpec`.

A later version is refused with a one-line :class:`~corral._errors.ConfigError` naming the
versions this corral reads.

:class:`RunSpec` is a frozen dataclass read by a plain-Python parser, not a pydantic model:
every driver reads a spec, and a takeover by ``corral attach`` must not pay for loading
pydantic (issue #17's start-up target). The parser takes, converts and refuses a stored
value as the pydantic model it replaced did (``tests/runs/test_spec.py`` checks it against
that model with hypothesis): each field's JSON type; a boolean also from ``0``/``1`` and
the words pydantic reads (``"yes"``, ``"off"``, ...); no unknown field.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Final, Literal

from corral._errors import ConfigError
from corral.harness._choice import HarnessChoice, run_config
from corral.harness._registry import build_harness, registration
from corral.stores._records import RunRecord

if TYPE_CHECKING:
    from corral.harness._base import Harness
    from corral.runs._request import RunRequest
    from corral.sandbox._definition import Sandbox

__all__ = ["SPEC_VERSION", "RunSpec", "check_harness", "harness_for_record", "run_spec_of"]

SPEC_VERSION: Final = 1
"""The run spec schema version this corral writes (and the newest it reads)."""

_V0_FIELDS: Final = frozenset(
    {"sandbox", "secret_names", "argv", "policy", "permission_prompt", "files", "agent"}
)
"""The run's own fields in a v0 (flat) spec; every other key there is a harness option."""


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """A run's spec (schema :data:`SPEC_VERSION`), as stored in ``record.spec``."""

    version: Literal[1] = 1
    harness_options: dict[str, Any] = field(default_factory=dict)
    """The harness options the run was started with (``RunRequest.options``)."""
    argv: list[str] | None = None
    """The command of a ``command``-harness run."""
    sandbox: dict[str, Any] | None = None
    """The sandbox definition (``Sandbox.to_dict()``; secret values never)."""
    secret_names: list[str] = field(default_factory=list)
    """The names of the sandbox's secrets: a driver that cannot redact them all withholds
    file events."""
    policy: dict[str, Any] | None = None
    """The policy an agent CLI enforces (only one the user wrote)."""
    permission_prompt: bool = False
    """The agent CLI asks corral (on the run's MCP server) before acting."""
    files: dict[str, Any] | None = None
    """File events: the baseline the agent's changes are measured against."""
    trace: dict[str, str] | None = None
    """The W3C trace context (``traceparent``) of the span that started the run: every
    driver, on any host, continues that trace (OpenTelemetry, when installed)."""
    frontend_tools: list[dict[str, Any]] | None = None
    """Tools an AG-UI client runs itself (:mod:`corral.tools._frontend`), offered to the
    agent by every driver of the run."""
    output_schema: dict[str, Any] | None = None
    """The JSON Schema the run's result must match (``RunRequest.output_schema``)."""
    agent: dict[str, Any] | None = None
    """An agent CLI run's runtime: sockets, the services daemon (its job and pid), the
    resumed session."""
    harness_package: dict[str, Any] | None = None
    """The package providing the run's harness (``{"name", "version"}``, and
    ``"in_process": true`` for a harness only ``register_harness`` registered in the
    starting process): what a process lacking the harness names
    (:meth:`corral.harness._registry.Registration.recorded`)."""

    @classmethod
    def of_request(cls, request: RunRequest, sandbox: Sandbox, harness: HarnessChoice
                   ) -> RunSpec:
        """The spec recorded for ``request`` run in ``sandbox`` with ``harness``."""
        agent = request.harness != "command"
        return cls(
            harness_options=dict(request.options),
            argv=list(request.command) if request.command is not None else None,
            sandbox=sandbox.to_dict(),
            # names only: a driver that cannot redact them all withholds file events
            secret_names=list(sandbox.secrets),
            policy=harness.policy,
            permission_prompt=harness.permission_prompt,
            frontend_tools=([dict(t) for t in request.frontend_tools]
                            if request.frontend_tools and agent else None),
            output_schema=(dict(request.output_schema) if request.output_schema is not None
                           else None),
            harness_package=harness.package,
        )

    def harness_config(self) -> dict[str, Any]:
        """The mapping a harness is built from (``build_harness(name, config)``): its
        options, plus what the run decided for it (command, policy, permission prompt),
        which wins over an option of the same name."""
        return run_config(self.harness_options, argv=self.argv, policy=self.policy,
                          permission_prompt=self.permission_prompt,
                          output_schema=self.output_schema)

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored as ``record.spec`` (fields that are ``None`` left out:
        a run without a policy has no ``policy``), its containers copies."""
        return {f.name: _copy(value) for f in fields(self)
                if (value := getattr(self, f.name)) is not None}

    def with_agent(self, **changes: Any) -> RunSpec:
        """This spec with ``changes`` merged into its ``agent`` mapping."""
        return replace(self, agent={**(self.agent or {}), **changes})

    @classmethod
    def parse(cls, data: Mapping[str, Any] | None, *, run_id: str = "?") -> RunSpec:
        """Read a stored spec of any version this corral knows (v0 is migrated).

        Raises :class:`ConfigError` (one line, naming the run) for a newer or malformed
        spec."""
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise ConfigError(f"run {run_id}: its spec is malformed: expected an object, "
                              f"not {type(data).__name__}")
        version = data.get("version")
        if version is None or isinstance(version, str):
            return cls._from_v0(data, run_id)
        if isinstance(version, bool) or not isinstance(version, int):
            raise ConfigError(f"run {run_id}: its spec has a malformed schema version "
                              f"{version!r}; expected an integer")
        if version > SPEC_VERSION or version < 1:
            raise ConfigError(
                f"run {run_id}: its spec has schema version {version}; this corral reads "
                f"unversioned (v0) specs and versions 1 to {SPEC_VERSION}: drive the run "
                "with a corral that knows its version")
        return cls._validated(data, run_id)

    @classmethod
    def _from_v0(cls, data: Mapping[str, Any], run_id: str) -> RunSpec:
        fields_ = {k: v for k, v in data.items() if k in _V0_FIELDS}
        options = {k: v for k, v in data.items() if k not in _V0_FIELDS}
        if fields_.get("secret_names") is None:
            fields_.pop("secret_names", None)
        return cls._validated({**fields_, "harness_options": options}, run_id)

    @classmethod
    def _validated(cls, data: Mapping[str, Any], run_id: str) -> RunSpec:
        try:
            values = {name: read(data[name], (name,))
                      for name, read in _READERS.items() if name in data}
            for name in data:
                if name not in _READERS:
                    raise _Malformed((name,), "not a field of the spec")
        except _Malformed as exc:
            where = ".".join(str(p) for p in exc.where)
            raise ConfigError(f"run {run_id}: its spec is malformed at {where}: "
                              f"{exc.what}") from None
        return cls(**values)


def run_spec_of(record: RunRecord) -> RunSpec:
    """The parsed spec of a run record (see :meth:`RunSpec.parse`)."""
    return RunSpec.parse(record.spec, run_id=record.run_id)


def harness_for_record(record: RunRecord) -> Harness:
    """The harness a run was started with, rebuilt from its record (name and spec);
    :class:`~corral.harness._registry.HarnessNotInstalled` (one line naming the package
    the run recorded) where it is not installed."""
    spec = run_spec_of(record)
    return build_harness(record.harness or "command", spec.harness_config(),
                         recorded=spec.harness_package)


def check_harness(record: RunRecord) -> None:
    """Raise :class:`~corral.harness._registry.HarnessNotInstalled` if the harness of
    ``record`` is not installed in this process (the check a driver makes before it claims
    the run: one that cannot translate its journal must leave it as it is)."""
    registration(record.harness or "command", recorded=run_spec_of(record).harness_package)


# --- the parser: a stored value read as the field's type -----------------------------

class _Malformed(Exception):
    def __init__(self, where: tuple[str | int, ...], what: str) -> None:
        super().__init__(what)
        self.where, self.what = where, what


_Where = tuple[str | int, ...]
_Reader = Callable[[Any, _Where], Any]
_TRUE: Final = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE: Final = frozenset({"0", "off", "f", "false", "n", "no"})


def _copy(value: Any) -> Any:
    """A JSON value with its containers copied (what is stored shares nothing)."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_copy(v) for v in value]
    return value


def _any(value: Any, where: _Where) -> Any:
    return value


def _str(value: Any, where: _Where) -> str:
    if not isinstance(value, str):
        raise _Malformed(where, "expected a string")
    return value


def _bool(value: Any, where: _Where) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
        return value.lower() in _TRUE
    raise _Malformed(where, "expected a boolean")


def _list(item: _Reader) -> _Reader:
    def read(value: Any, where: _Where) -> list[Any]:
        if not isinstance(value, (list, tuple)):
            raise _Malformed(where, "expected a list")
        return [item(v, (*where, i)) for i, v in enumerate(value)]
    return read


def _dict(item: _Reader) -> _Reader:
    def read(value: Any, where: _Where) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise _Malformed(where, "expected an object")
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise _Malformed((*where, k, "[key]"), "expected a string")
            out[k] = item(v, (*where, k))
        return out
    return read


def _optional(inner: _Reader) -> _Reader:
    return lambda value, where: None if value is None else inner(value, where)


def _version(value: Any, where: _Where) -> int:
    if type(value) is not int or value != SPEC_VERSION:  # parse() checked it already
        raise _Malformed(where, f"expected {SPEC_VERSION}")
    return value


_object = _dict(_any)
_READERS: Final[dict[str, _Reader]] = {  # RunSpec's fields, in its order
    "version": _version,
    "harness_options": _object,
    "argv": _optional(_list(_str)),
    "sandbox": _optional(_object),
    "secret_names": _list(_str),
    "policy": _optional(_object),
    "permission_prompt": _bool,
    "files": _optional(_object),
    "trace": _optional(_dict(_str)),
    "frontend_tools": _optional(_list(_object)),
    "output_schema": _optional(_object),
    "agent": _optional(_object),
    "harness_package": _optional(_object),
}
