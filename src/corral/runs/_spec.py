"""The run spec: what a run's record carries so that any process can continue the run.

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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from corral._errors import ConfigError
from corral.runs._specview import harness_for_record
from corral.stores._records import RunRecord

__all__ = ["SPEC_VERSION", "RunSpec", "harness_for_record", "run_spec_of"]

SPEC_VERSION: Final = 1
"""The run spec schema version this corral writes (and the newest it reads)."""

_V0_FIELDS: Final = frozenset(
    {"sandbox", "secret_names", "argv", "policy", "permission_prompt", "files", "agent"}
)
"""The run's own fields in a v0 (flat) spec; every other key there is a harness option."""


class RunSpec(BaseModel):
    """A run's spec (schema :data:`SPEC_VERSION`), as stored in ``record.spec``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    harness_options: dict[str, Any] = {}
    """The harness options the run was started with (``RunRequest.options``)."""
    argv: list[str] | None = None
    """The command of a ``command``-harness run."""
    sandbox: dict[str, Any] | None = None
    """The sandbox definition (``Sandbox.to_dict()``; secret values never)."""
    secret_names: list[str] = []
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

    def harness_config(self) -> dict[str, Any]:
        """The mapping a harness is built from (``build_harness(name, config)``): its
        options, plus what the run decided for it (command, policy, permission prompt),
        which wins over an option of the same name."""
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

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored as ``record.spec`` (fields that are ``None`` left out:
        a run without a policy has no ``policy``)."""
        return self.model_dump(mode="json", exclude_none=True)

    def with_agent(self, **changes: Any) -> RunSpec:
        """This spec with ``changes`` merged into its ``agent`` mapping."""
        return self.model_copy(update={"agent": {**(self.agent or {}), **changes}})

    @classmethod
    def parse(cls, data: Mapping[str, Any] | None, *, run_id: str = "?") -> RunSpec:
        """Read a stored spec of any version this corral knows (v0 is migrated).

        Raises :class:`ConfigError` (one line, naming the run) for a newer or malformed
        spec."""
        if data is None:
            return cls()
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
        return cls._validated(dict(data), run_id)

    @classmethod
    def _from_v0(cls, data: Mapping[str, Any], run_id: str) -> RunSpec:
        fields = {k: v for k, v in data.items() if k in _V0_FIELDS}
        options = {k: v for k, v in data.items() if k not in _V0_FIELDS}
        if fields.get("secret_names") is None:
            fields.pop("secret_names", None)
        return cls._validated({**fields, "harness_options": options}, run_id)

    @classmethod
    def _validated(cls, data: dict[str, Any], run_id: str) -> RunSpec:
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "spec"
            raise ConfigError(f"run {run_id}: its spec is malformed at {where}: "
                              f"{first['msg']}") from None


def run_spec_of(record: RunRecord) -> RunSpec:
    """The parsed spec of a run record (see :meth:`RunSpec.parse`)."""
    return RunSpec.parse(record.spec, run_id=record.run_id)


