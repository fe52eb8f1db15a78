"""The provider registry: a provider's name → how to build it, with a typed configuration.

A provider is registered under a name with a *factory* (a callable, usually the provider's
class) whose keyword arguments are its configuration, declared as a pydantic model (a
subclass of :class:`ProviderConfig`, which refuses unknown keys). The model is the factory's
``config_model`` attribute, or given to :func:`register_provider`; a factory without one
takes no configuration.

Providers are found, in this order:

1. :func:`register_provider` calls in this process;
2. the entry-point group ``corral.providers`` of the installed packages (corral's own
   ``local`` and ``bubblewrap`` are declared there too; a source checkout without install
   metadata still finds them through :data:`BUILTIN`), loaded on first use.

Loading is by name at run time (``importlib``), so this module, low in the layers, builds
providers of the packages above it without importing them.

Instance records name a provider by name, its configuration (as given, JSON) and the
package that registered it (``meta["provider"]``, read back by :func:`recorded_config`), so any process — a takeover, ``corral reap``,
``corral gc`` — rebuilds the same provider (:func:`build_provider`), and a process that lacks
the package says which one to install.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from corral._errors import ConfigError
from corral._plugins import EntryPointGroup, Loaded, Registry, config_message, registering
from corral.sandbox._contracts import Provider
from corral.sandbox._workspace import canonical_json

__all__ = [
    "BUILTIN",
    "GROUP",
    "ProviderConfig",
    "Registration",
    "build_provider",
    "config_data",
    "config_key",
    "parse_config",
    "provider_names",
    "recorded_config",
    "register_provider",
    "registration",
    "unregister_provider",
]

GROUP = "corral.providers"
"""The entry-point group a package declares its providers in."""

BUILTIN: Mapping[str, str] = {
    "local": "corral.providers._local:LocalProvider",
    "bubblewrap": "corral.providers._bubblewrap:BubblewrapProvider",
    "docker": "corral.providers._docker:DockerProvider",
}
"""corral's own providers, as declared in its ``pyproject.toml`` (used when the install
metadata is missing, e.g. ``PYTHONPATH=src``)."""


class ProviderConfig(BaseModel):
    """Base of a provider's configuration model: unknown keys are refused, values frozen.

    Field names are the factory's keyword arguments; only the keys a user gave are passed
    (the factory's own defaults apply to the rest) and recorded.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)


class _NoConfig(ProviderConfig):
    """A provider that takes no configuration."""


@dataclass(frozen=True, slots=True)
class Registration:
    """One registered provider."""

    name: str
    factory: Callable[..., Provider]
    config: type[ProviderConfig]
    package: str
    """The distribution that registered it (``corral`` for the built-ins), named in errors
    and recorded with the sandboxes it makes."""


def _config_model(factory: object, config: type[BaseModel] | None) -> type[ProviderConfig]:
    model = config if config is not None else getattr(factory, "config_model", None)
    if model is None:
        return _NoConfig
    if not (isinstance(model, type) and issubclass(model, ProviderConfig)):
        raise ConfigError(
            f"provider config model {model!r} must subclass corral.providers.ProviderConfig"
        )
    return model


def _from_entry_point(name: str, found: Loaded) -> Registration:
    factory: Any = found.obj
    return Registration(name, factory, _config_model(factory, None), found.package)


_providers = Registry(EntryPointGroup(GROUP, BUILTIN, "provider"), _from_entry_point)


def register_provider(
    name: str,
    factory: Callable[..., Provider],
    *,
    config: type[ProviderConfig] | None = None,
    package: str | None = None,
) -> None:
    """Register ``factory`` as the provider called ``name`` in this process.

    ``factory(**config)`` builds the provider; ``config`` is its configuration model
    (default: ``factory.config_model``; none means the provider takes no configuration).
    ``package`` names the distribution to install where the provider is missing (default:
    the factory's top-level module). A registration here wins over an entry point of the
    same name. To make the provider available to every process (takeover, ``corral reap``),
    declare it as an entry point instead::

        [project.entry-points."corral.providers"]
        mine = "my_package.provider:MyProvider"
    """
    pkg = registering("provider", name, factory, package)
    _providers.register(name, Registration(name, factory, _config_model(factory, config), pkg))


def unregister_provider(name: str) -> None:
    """Forget a provider registered with :func:`register_provider` (missing: a no-op)."""
    _providers.unregister(name)


def provider_names() -> list[str]:
    """Every provider name this process can build (registered or declared), sorted."""
    return _providers.names()


def registration(name: str, *, package: str | None = None) -> Registration:
    """The registration of ``name``; a one-line :class:`ConfigError` naming the package to
    install (``package``, from a record, when known) if nothing registers it."""
    reg = _providers.find(name)
    if reg is not None:
        return reg
    if not isinstance(name, str) or not name:
        raise ConfigError(f"provider: expected a provider name, got {name!r}")
    raise ConfigError(_providers.missing(name, "corral.providers.register_provider",
                                         package=package))


def parse_config(name: str, raw: Mapping[str, Any] | ProviderConfig | None = None,
                 *, package: str | None = None) -> ProviderConfig:
    """Validate ``raw`` against the configuration model of provider ``name``."""
    return _parsed(name, raw, package)[1]


def _parsed(name: str, raw: Mapping[str, Any] | ProviderConfig | None, package: str | None
            ) -> tuple[Registration, ProviderConfig]:
    reg = registration(name, package=package)
    if isinstance(raw, ProviderConfig):
        if not isinstance(raw, reg.config):
            raise ConfigError(f"provider {name!r}: expected a {reg.config.__name__}, "
                              f"got a {type(raw).__name__}")
        return reg, raw
    if raw is not None and not isinstance(raw, Mapping):
        raise ConfigError("provider: expected a table of settings")
    try:
        return reg, reg.config.model_validate(dict(raw or {}))
    except ValidationError as exc:
        raise ConfigError(config_message(exc, reg.config.model_fields, key="provider.",
                                         where="provider.",
                                         unknown=f"for provider {name!r}")) from None


def config_data(config: ProviderConfig) -> dict[str, Any]:
    """The keys a user gave, as JSON data (what records and the instance key carry)."""
    data: dict[str, Any] = config.model_dump(mode="json", exclude_unset=True)
    return data


def build_provider(
    name: str,
    config: Mapping[str, Any] | ProviderConfig | None = None,
    *,
    package: str | None = None,
) -> Provider:
    """Build provider ``name`` with ``config`` (validated first; see :func:`parse_config`)."""
    reg, cfg = _parsed(name, config, package)
    kwargs = {key: getattr(cfg, key) for key in cfg.model_fields_set}
    built = reg.factory(**kwargs)
    if not isinstance(built, Provider):
        raise ConfigError(f"provider {name!r}: its factory returned {type(built).__name__}, "
                          "which is not a corral.abc.Provider")
    return built


# ---------------------------------------------------------------------- records
def recorded_config(meta: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The provider configuration and package an instance record's ``meta`` names."""
    entry = meta.get("provider")
    if not isinstance(entry, Mapping):
        return {}, None  # written before records carried it: the defaults
    config = entry.get("config")
    package = entry.get("package")
    return (dict(config) if isinstance(config, Mapping) else {},
            package if isinstance(package, str) else None)


def config_key(config: Mapping[str, Any]) -> str:
    """A canonical string for caching providers by configuration."""
    return canonical_json(dict(config))
