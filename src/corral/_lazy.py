"""Lazy package namespaces (PEP 562): a package's public names resolve on first use, so
importing one submodule (the journal supervisor starts a fresh interpreter per run) does not
import the whole package.

A resolved class or function gets ``__module__`` set to the public-most namespace that exports
it (as anyio and trio do), so reprs, tracebacks and docs say ``corral.Runner``, not
``corral.runs._runner.Runner``. Public-most: ``corral`` over ``corral.sandbox`` over a private
``corral.sandbox._definition``. Pickle still works: it imports the named namespace and reads the
name through the namespace's ``__getattr__``.
"""

from __future__ import annotations

import importlib
import types
from collections.abc import Callable, Mapping
from typing import Any

# package name -> its exports (name -> module), for every lazy namespace imported so far.
# A package's parents are always imported before it, so an ancestor is always in here.
_NAMESPACES: dict[str, Mapping[str, str]] = {}


def lazy_exports(
    package: str, namespace: dict[str, Any], exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for a package whose ``exports`` map name → module."""
    _NAMESPACES[package] = exports

    def getattr_(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        publish(value, public_name(package, name))
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return getattr_, dir_


def public_name(package: str, name: str) -> str:
    """The highest namespace that exports ``package``'s ``name`` as the same object: an
    ancestor of ``package`` whose export of ``name`` comes from the same module, or from
    ``package`` itself (``corral`` maps ``Runner`` to ``corral.runs``)."""
    source = _NAMESPACES[package][name]
    best = package
    parts = package.split(".")
    for depth in range(len(parts) - 1, 0, -1):
        ancestor = ".".join(parts[:depth])
        mapped = _NAMESPACES.get(ancestor, {}).get(name)
        if mapped is not None and (mapped == source or _within(mapped, best)):
            best = ancestor
    return best


def publish(value: object, package: str) -> None:
    """Set ``value.__module__`` to ``package`` when that is more public than where it says it
    lives now (never for objects from outside corral, never to a less public name)."""
    if not isinstance(value, (type, types.FunctionType)):
        return  # constants, aliases: no __module__ of their own to fix
    current = getattr(value, "__module__", None)
    if not isinstance(current, str) or not _within(current, package.split(".")[0]):
        return
    if _rank(package) < _rank(current):
        value.__module__ = package


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _rank(module: str) -> tuple[bool, int]:
    """Lower is more public: no ``_``-private part first, then fewer parts."""
    parts = module.split(".")
    return any(p.startswith("_") for p in parts), len(parts)
