"""Plugins found by name: the one mechanism under corral's registries of providers
(:mod:`corral.sandbox._provider_registry`, group ``corral.providers``) and harnesses
(:mod:`corral.harness._registry`, group ``corral.harnesses``).

A :class:`Registry` holds what :meth:`Registry.register` registered in this process (it wins
over an entry point of the same name) over an :class:`EntryPointGroup`: corral's own names (as its ``pyproject.toml`` declares
them; used too where the install metadata is missing, e.g. ``PYTHONPATH=src``) and the
entry points the installed packages declare in the group, read once per process; each is
imported on first use (``importlib``: a low module builds plugins of packages above it
without importing them) and known with its package (distribution name and version), which
records name so that a process lacking it says what to install.

:func:`config_message` turns a plugin's configuration model refusing a value into one
line."""

from __future__ import annotations

import importlib.metadata as metadata
import threading
from collections.abc import Collection, Mapping
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from corral._errors import ConfigError
from corral._suggest import did_you_mean
from corral._version import __version__

if TYPE_CHECKING:
    # pydantic only on the error path: a driver taking over a command run never loads it
    from pydantic import ValidationError

__all__ = ["CORE_PACKAGE", "EntryPointGroup", "Loaded", "Registry", "config_message",
           "registering"]

CORE_PACKAGE = "corral"
"""The distribution corral's own plugins belong to."""


@dataclass(frozen=True, slots=True)
class Loaded:
    """One plugin imported from its entry point."""

    obj: object
    """What the entry point names (``module:attr``)."""
    package: str
    """The distribution that declares it (``corral`` for corral's own)."""
    version: str | None
    """That distribution's version (``None``: not known, e.g. no install metadata)."""


class EntryPointGroup:
    """The entry points of one group: ``builtin`` (corral's own, ``name → "module:attr"``;
    another package may not take their names) and the installed packages'. ``kind`` names
    the plugins in messages ("provider", "harness")."""

    def __init__(self, group: str, builtin: Mapping[str, str], kind: str) -> None:
        self.group, self.builtin, self.kind = group, builtin, kind
        self._lock = threading.Lock()
        self._points: dict[str, metadata.EntryPoint] | None = None
        self._loaded: dict[str, Loaded] = {}

    def declared(self) -> dict[str, metadata.EntryPoint]:
        """Every declared entry point by name, read once per process."""
        with self._lock:
            if self._points is None:
                found = {name: metadata.EntryPoint(name=name, value=value, group=self.group)
                         for name, value in self.builtin.items()}
                for ep in metadata.entry_points(group=self.group):
                    found.setdefault(ep.name, ep)  # corral's own names stay corral's
                self._points = found
            return self._points

    def package_of(self, ep: metadata.EntryPoint) -> tuple[str, str | None]:
        """The distribution (name, version) declaring ``ep``."""
        if ep.name in self.builtin:
            return CORE_PACKAGE, __version__
        dist = ep.dist
        if dist is None:
            return ep.module.split(".")[0], None
        return dist.name, dist.version

    def load(self, name: str) -> Loaded | None:
        """The entry point called ``name``, imported on first use (``None``: none is
        declared). An import that fails raises a one-line :class:`ConfigError` naming the
        package."""
        with self._lock:
            if name in self._loaded:
                return self._loaded[name]
        ep = self.declared().get(name)
        if ep is None:
            return None
        package, version = self.package_of(ep)
        try:
            obj = ep.load()
        except Exception as exc:  # noqa: BLE001 - any import failure is the package's to fix
            raise ConfigError(
                f"{self.kind} {name!r}: loading entry point {ep.value!r} of package "
                f"{package!r} failed: {exc}"
            ) from None
        loaded = Loaded(obj, package, version)
        with self._lock:
            self._loaded[name] = loaded
        return loaded


R = TypeVar("R")


class Registry(Generic[R]):
    """Registrations of one kind of plugin (``R``): those made in this process first, then
    the entry points of ``group``, each made into an ``R`` once by ``make(name, loaded)``
    on first use."""

    def __init__(self, group: EntryPointGroup, make: Callable[[str, Loaded], R]) -> None:
        self.group, self._make = group, make
        self._lock = threading.Lock()
        self._registered: dict[str, R] = {}
        self._made: dict[str, R] = {}

    def register(self, name: str, registration: R) -> None:
        """Make ``name`` this process's ``registration`` (over an entry point's)."""
        with self._lock:
            self._registered[name] = registration

    def unregister(self, name: str) -> None:
        """Forget what :meth:`register` registered as ``name`` (missing: a no-op)."""
        with self._lock:
            self._registered.pop(name, None)

    def find(self, name: str) -> R | None:
        """The registration of ``name``, ``None`` if nothing registers it."""
        with self._lock:
            found = self._registered.get(name) or self._made.get(name)
        if found is not None:
            return found
        loaded = self.group.load(name)
        if loaded is None:
            return None
        made = self._make(name, loaded)
        with self._lock:
            return self._made.setdefault(name, made)

    def names(self) -> list[str]:
        """Every name this process can find (registered or declared), sorted."""
        declared = self.group.declared()
        with self._lock:
            return sorted(set(self._registered) | set(declared))

    def missing(self, name: str, register: str, *, package: str | None = None,
                version: str | None = None, in_process: bool = False,
                recorded: bool = False) -> str:
        """One line saying that nothing here registers ``name``, and what to do:
        ``register`` is the function that registers one in this process
        (``corral.harness.register_harness``). ``package`` (and its ``version``) is the
        distribution a record named; ``recorded``: a run recorded it, so the line says
        the plugin is not installed *here* (``in_process``: only the process that
        started the run registered it)."""
        kind, group = self.group.kind, self.group.group
        known = f"known {kind}{'es' if kind.endswith('s') else 's'}: {', '.join(self.names())}"
        point = f"(entry point {name!r} in group {group!r})"
        if not (recorded and package):
            where = (f"install the package {package!r}" if package
                     else "install the package that provides it")
            return (f"unknown {kind} {name!r}{did_you_mean(name, self.names())}: no installed "
                    f"package declares it {point}; {where}, or call {register}({name!r}, "
                    f"factory); {known}")
        what = f"{package!r}" + (f" {version}" if version is not None else "")
        if in_process:
            return (f"{kind} {name!r} is not installed here: only the process that started "
                    f"the run registered it ({register.rpartition('.')[2]}"
                    + (f", package {what}" if version is not None else "")
                    + f"); declare it as an entry point in group {group!r} of an installed "
                    f"package to drive its runs from any process; {known}")
        return (f"{kind} {name!r} is not installed here: install the package {what}, which "
                f"declares it {point}; {known}")


def registering(kind: str, name: object, factory: object, package: str | None) -> str:
    """Check a registration of ``factory`` as the ``kind`` called ``name`` (one-line
    :class:`ConfigError`s); the package it belongs to: ``package``, else the factory's
    top-level module."""
    if not isinstance(name, str) or not name or not name.replace("-", "_").isidentifier():
        raise ConfigError(f"{kind} name {name!r}: use letters, digits, '_' or '-'")
    if not callable(factory):
        raise ConfigError(f"{kind} {name!r}: the factory must be callable")
    return package or str(getattr(factory, "__module__", "") or name).split(".")[0]


def config_message(exc: ValidationError, fields: Collection[str], *, key: str, unknown: str,
                   where: str) -> str:
    """One line for a configuration model's refusal ``exc``: each error in turn, ``"; "``
    between them. A key the model does not take reads ``unknown key '<key><field>' (did
    you mean ...?) <unknown> (accepted keys: <fields>)``; any other error ``<where><field>:
    <message>``, or the :class:`ConfigError` a validator of the model raised, as it
    is."""
    accepted = ", ".join(fields) or "none"
    parts = []
    for err in exc.errors():
        at = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            hint = did_you_mean(str(err["loc"][-1]), fields)
            parts.append(f"unknown key '{key}{at}'{hint} {unknown} (accepted keys: "
                         f"{accepted})")
            continue
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, ConfigError):
            parts.append(str(cause))
        else:
            parts.append(f"{where}{at}: {err['msg']}")
    return "; ".join(parts)
