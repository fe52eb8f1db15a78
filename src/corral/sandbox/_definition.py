"""The sandbox definition: provider + workspace + policy + lifecycle (+ hooks).

A :class:`Sandbox` is plain data and lazy: building one creates nothing. The instance
behind it is found or made by :meth:`Sandbox.ensure` (resume → restore snapshot →
create + bootstrap, under a per-key lock).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from corral._errors import ConfigError
import corral._validate as v
from corral.sandbox._contracts import DEFAULT_PROVIDER, Provider
from corral.sandbox._hooks import Hooks
from corral.sandbox._key import RunContext, instance_key
from corral.sandbox._lifecycle import Lifecycle
from corral.policy._policy import Policy
from corral.sandbox._provider_registry import (
    ProviderConfig,
    build_provider,
    config_data,
    parse_config,
    registration,
)
from corral.sandbox._secrets import Secrets
from corral.sandbox._sources import source_from_dict
from corral.sandbox._workspace import Workspace
from corral.sandbox._ensure import Ensured, InstanceStoreLike, SpecHook, destroy, ensure

__all__ = ["Sandbox"]

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
TOP_KEYS = ("id", "provider", "workspace", "secrets", "policy", "lifecycle", "file_events",
            "agent")
"""(``[agent]``: which agent ``corral run`` starts, read by the CLI, not the sandbox:
:func:`corral.sandbox._config_file.agent_table`.)"""


@dataclass(frozen=True)
class Sandbox:
    """A sandbox definition.

    ``provider`` is a provider object or the name of a registered provider
    (``"bubblewrap"``, ``"local"``, or one a package registers) built with
    ``provider_config``, which is checked against the provider's config model here (an
    unknown key is a ConfigError), is part of the instance key, and is recorded so that
    other processes rebuild the same provider. ``id`` names the definition; it is part of
    the instance key, so two definitions never share a sandbox.
    """

    provider: Provider | str = DEFAULT_PROVIDER
    workspace: Workspace = field(default_factory=Workspace)
    policy: Policy = field(default_factory=Policy)
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    hooks: Hooks = field(default_factory=Hooks)
    id: str = "default"
    provider_config: Mapping[str, Any] = field(default_factory=dict)
    file_events: bool | Literal["diff"] = False
    """Runs log the agent's workspace changes as ``CUSTOM sandbox.file`` events
    (``"diff"``: with ``sandbox.file.diff`` patches too); see :mod:`corral.runs._file_feed`.
    Not part of the instance key."""
    _provider_cache: list[Provider] = field(
        default_factory=list, init=False, repr=False, compare=False, hash=False
    )
    _config: ProviderConfig | None = field(
        default=None, init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not _ID_RE.match(self.id):
            raise ConfigError(
                f"sandbox.id: {self.id!r} is not a valid id; use 1-64 letters, digits, "
                "'_', '.' or '-', starting with a letter or digit"
            )
        for name, typ in (
            ("workspace", Workspace), ("policy", Policy), ("lifecycle", Lifecycle), ("hooks", Hooks)
        ):  # fmt: skip
            if not isinstance(getattr(self, name), typ):
                raise ConfigError(f"sandbox.{name}: expected a corral.{typ.__name__}")
        if isinstance(self.provider, str):
            v.string(self.provider, "provider.name")
        elif not isinstance(self.provider, Provider):
            raise ConfigError("sandbox.provider: expected a provider object or a provider name")
        elif self.provider_config:
            raise ConfigError(
                "sandbox.provider_config: only used with a provider name; configure the "
                "provider object directly instead"
            )
        if not isinstance(self.provider_config, Mapping):
            raise ConfigError("sandbox.provider_config: expected a table")
        if isinstance(self.provider, str):
            config = parse_config(self.provider, self.provider_config)
            object.__setattr__(self, "_config", config)
            object.__setattr__(self, "provider_config", config_data(config))
        if not (isinstance(self.file_events, bool) or self.file_events == "diff"):
            raise ConfigError(f'sandbox.file_events: {self.file_events!r}; use true, false '
                              'or "diff"')
        if self._config is None:
            object.__setattr__(self, "provider_config", dict(self.provider_config))

    # ------------------------------------------------------------------ provider
    def get_provider(self) -> Provider:
        """The provider object (built once from the name and config when needed)."""
        if not isinstance(self.provider, str):
            return self.provider
        if not self._provider_cache:
            built = build_provider(self.provider, self._config)
            self._provider_cache.append(built)
        return self._provider_cache[0]

    @property
    def provider_name(self) -> str:
        return self.provider if isinstance(self.provider, str) else self.provider.name

    def provider_record(self) -> dict[str, Any]:
        """What instance records keep about the provider: its name, configuration (as
        given) and the package that registers it, enough to rebuild it in any process.
        A provider given as an object is recorded with no configuration: other processes
        build it by name with its defaults (give a name and ``provider_config`` instead)."""
        name = self.provider_name
        try:
            package: str | None = registration(name).package
        except ConfigError:
            package = None  # an object under a name nothing registers
        return {"name": name, "config": dict(self.provider_config), "package": package}

    @property
    def secrets(self) -> Secrets:
        return self.workspace.secrets

    # ------------------------------------------------------------------ key
    def key(self, ctx: RunContext) -> str:
        """The instance key for ``ctx`` (see :mod:`corral.sandbox._key`)."""
        provider = self.get_provider()
        return instance_key(
            definition_id=self.id,
            provider_name=provider.name,
            provider_fingerprint=provider.fingerprint(),
            workspace_hash=self.workspace.hash(),
            # direct network only: an allowlist is served per run, outside the sandbox
            egress=self.policy.direct_network,
            ctx=ctx,
            reuse=self.lifecycle.reuse,
            provider_config=self.provider_config,
        )

    # ------------------------------------------------------------------ instances
    async def ensure(
        self,
        ctx: RunContext,
        *,
        store: InstanceStoreLike | None = None,
        spec_hook: SpecHook | None = None,
    ) -> Ensured:
        """Resume, restore or create (and bootstrap) the sandbox for ``ctx``.
        ``spec_hook`` adjusts the spec of a sandbox made here (see
        :func:`corral.sandbox._ensure.ensure`)."""

        return await ensure(self, ctx, store=store, spec_hook=spec_hook)

    async def destroy(self, ctx: RunContext, *, store: InstanceStoreLike | None = None) -> bool:
        """Destroy the sandbox for ``ctx`` and forget it. True when there was one."""

        return await destroy(self, ctx, store=store)

    # ------------------------------------------------------------------ data
    def to_dict(self) -> dict[str, Any]:
        """Plain data (hooks and secret values excluded)."""
        ws = self.workspace.to_dict()
        return {
            "id": self.id,
            "provider": {"name": self.provider_name, **dict(self.provider_config)},
            "workspace": {
                "source": ws["source"],
                "setup": ws["setup"],
                "scripts": ws["scripts"],
                "instructions": ws["instructions"],
                **({"max_copy_size": ws["max_copy_size"]} if "max_copy_size" in ws else {}),
            },
            "secrets": self.workspace.secrets.origins(),
            "policy": self.policy.to_dict(),
            "lifecycle": self.lifecycle.to_dict(),
            **({"file_events": self.file_events} if self.file_events else {}),
        }

    @classmethod
    def from_dict(
        cls,
        data: Mapping[str, Any],
        *,
        environ: Mapping[str, str] | None = None,
        hooks: Hooks | None = None,
    ) -> Sandbox:
        """Build from plain data (the shape of ``corral.toml``). Unknown keys are errors."""
        v.no_unknown(data, TOP_KEYS, "")
        provider = data.get("provider", {"name": DEFAULT_PROVIDER})
        if isinstance(provider, str):
            provider = {"name": provider}
        if not isinstance(provider, Mapping):
            raise ConfigError("provider: expected a table with a name")
        provider_name = v.string(provider.get("name", DEFAULT_PROVIDER), "provider.name")
        provider_config = {k: val for k, val in provider.items() if k != "name"}

        secrets_data = data.get("secrets", {})
        if not isinstance(secrets_data, Mapping):
            raise ConfigError('secrets: expected a table of NAME = { env = "VAR" }')
        secrets = Secrets.from_sources(secrets_data, environ)

        ws = data.get("workspace", {})
        if not isinstance(ws, Mapping):
            raise ConfigError("workspace: expected a table")
        v.no_unknown(ws, ("source", "setup", "scripts", "instructions", "max_copy_size"),
                     "workspace")
        src = ws.get("source")
        if src is not None and not isinstance(src, Mapping):
            raise ConfigError("workspace.source: expected a table")
        workspace = Workspace(
            source=source_from_dict(src, secrets) if src is not None else source_from_dict({}),
            setup=ws.get("setup", ()),
            scripts=ws.get("scripts", {}),
            instructions=ws.get("instructions"),
            secrets=secrets,
            max_copy_size=ws.get("max_copy_size"),
        )

        pol = data.get("policy", {})
        if not isinstance(pol, Mapping):
            raise ConfigError("policy: expected a table")
        v.no_unknown(
            pol,
            ("allow", "ask", "deny", "default", "file_write", "network", "unparseable",
             "allow_hosts"),
            "policy",
        )
        policy = Policy(**pol)

        life = data.get("lifecycle", {})
        if not isinstance(life, Mapping):
            raise ConfigError("lifecycle: expected a table")
        v.no_unknown(life, ("reuse", "snapshot", "keep_alive", "destroy_on_complete",
                           "checkpoint", "checkpoint_max_size", "on_checkpoint_too_large"),
                     "lifecycle")
        lifecycle = Lifecycle(**life)

        return cls(
            provider=provider_name,
            provider_config=provider_config,
            workspace=workspace,
            policy=policy,
            lifecycle=lifecycle,
            hooks=hooks or Hooks(),
            id=v.string(data.get("id", "default"), "id"),
            file_events=data.get("file_events", False),
        )
