"""The harness registry: a harness's name → how to build it, with a typed configuration,
in the shape of the provider registry (:mod:`corral.sandbox._provider_registry`).

A harness is registered under a name with a *factory* (usually the harness's class) whose
keyword arguments are its configuration, declared as a pydantic model (a subclass of
:class:`~corral.harness._config.HarnessConfig`): the factory's ``config_model`` attribute,
or given to :func:`register_harness`. A factory registered without one is called with the
configuration mapping itself (the form :func:`register_harness` always took). The registry
asks the model for the factory's arguments (:class:`ConfigModel`), so one that must not
load pydantic may do without it: the ``command`` harness's
(:class:`~corral.harness._command.CommandConfig`), since a driver taking over a command
run (``corral attach``) would otherwise import pydantic before its first event.

Harnesses are found, in this order:

1. :func:`register_harness` calls in this process (only this process sees them);
2. the entry-point group ``corral.harnesses`` of the installed packages (corral's own
   harnesses are declared there too; a source checkout without install metadata still
   finds them through :data:`BUILTIN`), imported on first use (so a driver taking over a
   ``command`` run never loads the agent-CLI adapters).

A run records its harness's name (``record.harness``), its configuration (the run spec,
:meth:`corral.runs._spec.RunSpec.harness_config`) and the package that provides it
(``RunSpec.harness_package``, :meth:`Registration.recorded`), so any process (``corral
attach``, ``corral reap``, the server) rebuilds the same harness (:func:`build_harness`),
and a process that lacks it says which package to install, or that the harness was only
registered in the process that started the run (:class:`HarnessNotInstalled`). This module
knows nothing of run records.
"""

from __future__ import annotations

import importlib.metadata as metadata
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from corral._errors import ConfigError
from corral._plugins import EntryPointGroup, Loaded, Registry, registering
from corral.harness._base import Harness

__all__ = [
    "BUILTIN",
    "GROUP",
    "ConfigModel",
    "HarnessFactory",
    "HarnessNotInstalled",
    "Registration",
    "build_harness",
    "build_registered",
    "harness_names",
    "register_harness",
    "registration",
    "unregister_harness",
]

GROUP = "corral.harnesses"
"""The entry-point group a package declares its harnesses in."""

BUILTIN: Mapping[str, str] = {
    "command": "corral.harness._command:CommandHarness",
    "acp": "corral.harness._acp:AcpHarness",
    "claude-code": "corral.harness._claude_code:ClaudeCodeHarness",
    "codex": "corral.harness._codex:CodexHarness",
    "gemini-cli": "corral.harness._gemini_cli:GeminiCliHarness",
    "opencode": "corral.harness._opencode:OpencodeHarness",
}
"""corral's own harnesses, as declared in its ``pyproject.toml`` (used when the install
metadata is missing, e.g. ``PYTHONPATH=src``)."""

HarnessFactory = Callable[..., Harness]
"""Builds a harness: ``factory(**config)`` with the keys of its configuration model the
run gave, or ``factory(mapping)`` for a factory registered without a model."""


class ConfigModel(Protocol):
    """A harness's configuration model, as the registry uses it (what
    :class:`~corral.harness._config.HarnessConfig` implements)."""

    @classmethod
    def factory_kwargs(cls, name: str, config: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments of harness ``name``'s factory from the run's harness
        configuration ``config``; a one-line :class:`ConfigError` for a bad value."""
        ...


class HarnessNotInstalled(ConfigError):
    """A run's harness is neither registered in this process nor declared by an installed
    package: the message names the package to install (as the run recorded it)."""

    code = "unknown_harness"


@dataclass(frozen=True, slots=True)
class Registration:
    """One registered harness."""

    name: str
    factory: HarnessFactory
    config: type[ConfigModel] | None
    """Its configuration model (``None``: the factory takes the mapping as is)."""
    package: str
    """The distribution that provides it (``corral`` for the built-ins), named in errors
    and recorded with its runs."""
    version: str | None
    """That distribution's version, when known."""
    in_process: bool
    """Registered with :func:`register_harness`: no other process knows it."""

    def recorded(self) -> dict[str, Any]:
        """What a run records of it (``RunSpec.harness_package``)."""
        out: dict[str, Any] = {"name": self.package}
        if self.version is not None:
            out["version"] = self.version
        if self.in_process:
            out["in_process"] = True
        return out


def _config_model(name: str, factory: object,
                  config: type[ConfigModel] | None) -> type[ConfigModel] | None:
    model = config if config is not None else getattr(factory, "config_model", None)
    if model is not None and not (isinstance(model, type)
                                  and callable(getattr(model, "factory_kwargs", None))):
        raise ConfigError(f"harness {name!r}: its config model {model!r} must subclass "
                          "corral.harness.HarnessConfig")
    model_type: type[ConfigModel] | None = model
    return model_type


def _version_of(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _from_entry_point(name: str, found: Loaded) -> Registration:
    factory: Any = found.obj
    if not callable(factory):
        raise ConfigError(f"harness {name!r}: entry point of package {found.package!r} "
                          f"names {factory!r}, which is not callable")
    return Registration(name, factory, _config_model(name, factory, None), found.package,
                        found.version, in_process=False)


_harnesses = Registry(EntryPointGroup(GROUP, BUILTIN, "harness"), _from_entry_point)


def register_harness(
    name: str,
    factory: HarnessFactory,
    *,
    config: type[ConfigModel] | None = None,
    package: str | None = None,
) -> None:
    """Register ``factory`` as the harness called ``name`` in this process.

    ``factory(**config)`` builds the harness; ``config`` is its configuration model
    (default: ``factory.config_model``; none means the factory is called with the run's
    harness configuration mapping). ``package`` names the distribution providing it
    (default: the factory's top-level module). A registration here wins over an entry
    point of the same name, and only this process sees it: a run of it cannot be taken
    over, attached to or reaped by another process (they say so, and leave the run
    alone). To make the harness available to every process, declare it as an entry point
    instead::

        [project.entry-points."corral.harnesses"]
        mine = "my_package.harness:MyHarness"
    """
    pkg = registering("harness", name, factory, package)
    _harnesses.register(name, Registration(name, factory, _config_model(name, factory, config),
                                           pkg, _version_of(pkg), in_process=True))


def unregister_harness(name: str) -> None:
    """Forget a harness registered with :func:`register_harness` (missing: a no-op)."""
    _harnesses.unregister(name)


def harness_names() -> list[str]:
    """Every harness name this process can build (registered or declared), sorted."""
    return _harnesses.names()


def registration(name: str, *, recorded: Mapping[str, Any] | None = None) -> Registration:
    """The registration of ``name``; :class:`HarnessNotInstalled` (one line, naming the
    package ``recorded`` by a run, when given) if nothing registers it."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"harness: expected a harness name, got {name!r}")
    reg = _harnesses.find(name)
    if reg is None:
        package = recorded.get("name") if recorded is not None else None
        version = recorded.get("version") if recorded is not None else None
        raise HarnessNotInstalled(_harnesses.missing(
            name, "corral.harness.register_harness",
            package=package if isinstance(package, str) and package else None,
            version=version if isinstance(version, str) else None,
            in_process=recorded is not None and recorded.get("in_process") is True,
            recorded=recorded is not None))
    return reg


def build_harness(name: str, config: Mapping[str, Any], *,
                  recorded: Mapping[str, Any] | None = None) -> Harness:
    """The harness called ``name`` built from ``config`` (a run's harness configuration,
    validated by its model first; see :class:`~corral.harness._config.HarnessConfig`).
    ``recorded``: the package a run recorded (``RunSpec.harness_package``), named if the
    harness is not installed here."""
    return build_registered(name, config, recorded=recorded)[1]


def build_registered(name: str, config: Mapping[str, Any], *,
                     recorded: Mapping[str, Any] | None = None
                     ) -> tuple[Registration, Harness]:
    """:func:`build_harness`, with the registration that built it."""
    reg = registration(name, recorded=recorded)
    given = {k: v for k, v in config.items() if k != "output_schema"}  # the registry's
    harness: Harness
    if reg.config is None:
        harness = reg.factory(given)
    else:
        harness = reg.factory(**reg.config.factory_kwargs(name, given))
    schema = config.get("output_schema")
    if schema is not None:
        use = getattr(harness, "use_output_schema", None)
        if use is None:
            raise ConfigError(
                f"the {name} harness cannot return a structured result (output_schema): "
                "use an agent CLI harness (claude-code, codex, opencode, gemini-cli, acp)")
        use(schema)
    return reg, harness
