"""The providers a runner drives runs with: built through the registry once each, with the
configuration a run's record names (so any process rebuilds a plugin's provider as the run's
definition configured it)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from corral.runs._spec import run_spec_of
from corral.stores._records import RunRecord

if TYPE_CHECKING:
    from corral.sandbox._contracts import Provider


class ProviderCache:
    """Providers by name and configuration, built on first use."""

    def __init__(self, provider_config: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self._config = {name: dict(c) for name, c in (provider_config or {}).items()}
        self._built: dict[str, Provider] = {}

    def get(self, name: str, config: Mapping[str, Any] | None = None,
            package: str | None = None) -> Provider:
        """Provider ``name`` with ``config`` (as a record names it; ``None``: this runner's
        configuration for it). ``package``: the one to name in the error when ``name`` is
        not installed here."""
        # The registry (pydantic configs, the providers) loads when a provider is first
        # built: a driver taking over a command run on this host may need none.
        from corral.providers import get_provider
        from corral.sandbox._provider_registry import build_provider, config_key

        if config is None:
            if name not in self._built:
                self._built[name] = get_provider(name, **self._config.get(name, {}))
            return self._built[name]
        which = f"{name} {config_key(config)}"  # never a provider name (no spaces in those)
        if which not in self._built:
            self._built[which] = build_provider(name, config, package=package)
        return self._built[which]

    def built(self) -> dict[str, Provider]:
        """The providers built so far with this runner's configuration, by name."""
        return {name: p for name, p in self._built.items() if " " not in name}

    def for_record(self, record: RunRecord) -> Callable[[str], Provider]:
        """Provider by name, built with the configuration the run's definition recorded."""
        sandbox = run_spec_of(record).sandbox or {}
        entry = sandbox.get("provider")

        def provider_for(name: str) -> Provider:
            if isinstance(entry, Mapping) and entry.get("name") == name:
                config = {k: v for k, v in entry.items() if k != "name"}
                return self.get(name, config or None)
            return self.get(name)

        return provider_for
