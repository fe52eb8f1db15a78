"""The instance key: which live sandbox a run gets (DESIGN §2).

SHA-256 over canonical JSON of the definition id, the provider's name, its configuration
(the keys given, when any) and fingerprint, the workspace hash (no secret values), whether the sandbox has direct network (an
egress allowlist is served per run from outside, so it does not change the sandbox), the
tenant, and the thread (or thread + run unless ``reuse="thread"``). It is never the
thread alone: a changed provider, image, workspace or tenant must get another sandbox.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from corral._errors import ConfigError
from corral.sandbox._lifecycle import Reuse
from corral.sandbox._workspace import canonical_json

__all__ = ["KEY_VERSION", "KeyInput", "RunContext", "instance_key"]

KEY_VERSION = 1


@dataclass(frozen=True, slots=True)
class RunContext:
    """Who is asking for a sandbox: the thread, the run and (optionally) the tenant."""

    thread_id: str
    run_id: str
    tenant: str | None = None

    def __post_init__(self) -> None:
        for name in ("thread_id", "run_id"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ConfigError(f"context.{name}: must be a non-empty string")
        if self.tenant is not None and (not isinstance(self.tenant, str) or not self.tenant):
            raise ConfigError("context.tenant: must be a non-empty string or None")


@dataclass(frozen=True, slots=True)
class KeyInput:
    """Everything the key covers, as plain data."""

    definition_id: str
    provider_name: str
    provider_fingerprint: str
    workspace_hash: str
    egress: bool
    tenant: str | None
    thread_id: str
    run_id: str | None
    """Only set when runs do not share sandboxes (``reuse`` run or none)."""
    provider_config: Mapping[str, Any] = field(default_factory=dict)
    """The provider configuration as given (JSON data); empty for the defaults."""

    def canonical(self) -> str:
        # The configuration only when one was given: keys of sandboxes made with the
        # defaults stay what they were before configurations were keyed.
        config = {"provider_config": dict(self.provider_config)} if self.provider_config else {}
        return canonical_json(
            {
                **config,
                "v": KEY_VERSION,
                "definition": self.definition_id,
                "provider": self.provider_name,
                "provider_fingerprint": self.provider_fingerprint,
                "workspace": self.workspace_hash,
                "egress": self.egress,
                "tenant": self.tenant,
                "thread": self.thread_id,
                "run": self.run_id,
            }
        )


def instance_key(
    *,
    definition_id: str,
    provider_name: str,
    provider_fingerprint: str,
    workspace_hash: str,
    egress: bool,
    ctx: RunContext,
    reuse: Reuse,
    provider_config: Mapping[str, Any] | None = None,
) -> str:
    """The 64-hex-digit instance key for ``ctx`` under these settings."""
    run_id = None if reuse == "thread" else ctx.run_id
    data = KeyInput(
        definition_id=definition_id,
        provider_name=provider_name,
        provider_fingerprint=provider_fingerprint,
        workspace_hash=workspace_hash,
        egress=egress,
        tenant=ctx.tenant,
        thread_id=ctx.thread_id,
        run_id=run_id,
        provider_config=dict(provider_config or {}),
    )
    return hashlib.sha256(data.canonical().encode("utf-8")).hexdigest()
