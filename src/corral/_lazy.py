"""Lazy package namespaces (PEP 562): a package's public names resolve on first use, so
importing one submodule (the journal supervisor starts a fresh interpreter per run) does not
import the whole package.

One list per namespace. A public ``__init__.py`` lists its names once, as the imports of its
``TYPE_CHECKING`` block, each in the explicit re-export form ``from MODULE import NAME as
NAME`` (so mypy ``--strict`` and IDEs see every name, and only those)::

    from corral._lazy import TYPE_CHECKING, lazy_namespace

    if TYPE_CHECKING or not lazy_namespace(globals()):
        from corral.runs._runner import Runner as Runner

(``TYPE_CHECKING`` is ``False`` here, as :data:`typing.TYPE_CHECKING` is, without importing
:mod:`typing`, which costs more than the rest of ``import corral``: mypy and pyright take any
name ``TYPE_CHECKING`` as true.)

Importing the namespace reads its source file and nothing more; its first lookup (a name,
``__all__``, ``dir()``) reads the block and derives the rest: the name → module map its
``__getattr__`` resolves, ``__all__`` (in the block's order) and ``__dir__``. The block is
read with string methods, not :mod:`ast` (the first AST parse in a process costs about a
millisecond, ten times the whole derivation); tests/test_lazy.py checks that this reading
agrees with :mod:`ast` on every namespace, and anything it does not understand is an
ImportError naming the line. Where the source cannot be read (a sourceless install),
:func:`lazy_namespace` returns ``False`` and the block runs as plain imports.

A resolved class or function gets ``__module__`` set to the public-most namespace that exports
it (as anyio and trio do), so reprs, tracebacks and docs say ``corral.Runner``, not
``corral.runs._runner.Runner``. Public-most: ``corral`` over ``corral.sandbox`` over a private
``corral.sandbox._definition``. Pickle still works: it imports the named namespace and reads the
name through the namespace's ``__getattr__``.

A name that moved to another namespace (protocols live in ``corral.abc`` only) stays
resolvable where it was, with a ``DeprecationWarning``, but is no longer listed there.
"""

from __future__ import annotations

import importlib
import types
import warnings

TYPE_CHECKING = False  # see the module docstring
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

# package name -> (source, file name) of every lazy namespace imported so far; its exports
# (name -> (module, attribute)) are read from the source on the package's first lookup, so
# importing a namespace costs one file read. A package's parents are always imported before
# it, so an ancestor is always in here.
_SOURCES: dict[str, tuple[str, str]] = {}
_NAMESPACES: dict[str, dict[str, tuple[str, str]]] = {}

_FORM = "`from MODULE import NAME as NAME` lines (and comments)"


def lazy_namespace(namespace: dict[str, Any], *, moved: Mapping[str, str] | None = None
                   ) -> bool:
    """Make the package whose globals are ``namespace`` lazy, its exports read from its
    ``TYPE_CHECKING`` block (on first lookup); install ``__getattr__`` (which also answers
    ``__all__``) and ``__dir__`` there. ``moved`` maps a former export to the namespace that
    has it now (a deprecated alias). ``False`` when the package's source cannot be read: the
    caller then imports the block."""
    package: str = namespace["__name__"]
    moved = dict(moved or {})
    source = _source(namespace.get("__file__"))
    if source is None:
        _SOURCES.pop(package, None)
    else:
        _SOURCES[package] = (source, namespace["__file__"])
    _NAMESPACES.pop(package, None)  # a reloaded namespace reads its block again
    eager_before = set(namespace) | {"__getattr__", "__dir__"}

    def getattr_(name: str) -> Any:
        target = _exports(package).get(name)
        if target is None:
            if name == "__all__":
                if source is None:  # the block was imported: its names are the exports
                    return [n for n, v in namespace.items()
                            if n not in eager_before and not isinstance(v, types.ModuleType)]
                namespace["__all__"] = list(_exports(package))
                return namespace["__all__"]
            if name in moved:
                return _moved(package, name, moved[name])
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(target[0]), target[1])
        publish(value, public_name(package, name))
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(_exports(package)))

    namespace["__getattr__"], namespace["__dir__"] = getattr_, dir_
    return source is not None


def _exports(package: str) -> dict[str, tuple[str, str]]:
    """``package``'s exports, read from its source the first time (``{}`` for a package
    that is not a lazy namespace, or whose block was imported as it stands)."""
    exports = _NAMESPACES.get(package)
    if exports is None:
        pending = _SOURCES.get(package)  # kept: a thread reading at the same time needs it
        exports = {} if pending is None else exports_of(pending[0], package, pending[1])
        _NAMESPACES[package] = exports
    return exports


def exports_of(source: str, package: str, filename: str) -> dict[str, tuple[str, str]]:
    """The ``TYPE_CHECKING`` block of a package's ``__init__`` source, as ``{exported name:
    (module, attribute)}`` in the block's order. ImportError, naming the file and line, for
    anything but one such block of :data:`_FORM`, a name twice, or an import that is not an
    explicit re-export."""
    lines = source.split("\n")
    starts = [i for i, line in enumerate(lines)
              if line.startswith("if TYPE_CHECKING") and line.rstrip().endswith(":")]
    if len(starts) != 1:
        raise ImportError(f"{filename}: a lazy namespace needs exactly one `if TYPE_CHECKING"
                          f"...:` block at the top level (found {len(starts)})")
    exports: dict[str, tuple[str, str]] = {}
    statement: list[str] = []
    first = 0
    for number, raw in enumerate(lines[starts[0] + 1:], starts[0] + 2):
        line = raw.partition("#")[0].strip()  # no '#' in an import line but a comment's
        if not line:
            continue
        if not statement:
            if raw[0] not in " \t":
                break  # the first statement after the block
            first = number
        statement.append(line)
        if "(" in statement[0] and ")" not in line:
            continue  # a parenthesised list goes on
        for name, target in _names(" ".join(statement), package, f"{filename}:{first}"):
            if name in exports:
                raise ImportError(f"{filename}:{first}: {name!r} is exported twice")
            exports[name] = target
        statement = []
    if statement:
        raise ImportError(f"{filename}:{first}: unfinished import in the TYPE_CHECKING block")
    return exports


def _names(text: str, package: str, where: str) -> list[tuple[str, tuple[str, str]]]:
    """``from MODULE import A as A, B as B`` (parenthesised or not) → ``[(A, (module,
    A)), …]``."""
    head, sep, tail = text.partition(" import ")
    words = head.split()
    if not sep or len(words) != 2 or words[0] != "from":
        raise ImportError(f"{where}: the TYPE_CHECKING block of a lazy namespace holds "
                          f"{_FORM} only, not {text!r}")
    module = _absolute(words[1], package, where)
    tail = tail.strip()
    if tail.startswith("("):
        if not tail.endswith(")"):
            raise ImportError(f"{where}: unbalanced parentheses in {text!r}")
        tail = tail[1:-1]
    items = tail.split(",")
    if len(items) > 1 and not items[-1].strip():
        items.pop()  # the trailing comma
    found: list[tuple[str, tuple[str, str]]] = []
    for item in items:
        name, _, alias = item.partition(" as ")
        name, alias = name.strip(), alias.strip()
        if not (name.isidentifier() and alias.isidentifier()):
            raise ImportError(f"{where}: {item.strip()!r} is not `NAME as NAME` (an explicit "
                              "re-export, so type checkers see the name as public)")
        found.append((alias, (module, name)))
    return found


def _absolute(module: str, package: str, where: str) -> str:
    dots = len(module) - len(module.lstrip("."))
    if not dots:
        return module
    base = package.rsplit(".", dots - 1)[0] if dots > 1 else package
    rest = module[dots:]
    if not rest or base.count(".") < dots - 1:
        raise ImportError(f"{where}: cannot resolve {module!r} from {package!r}")
    return f"{base}.{rest}"


def _source(filename: object) -> str | None:
    if not isinstance(filename, str) or not filename.endswith(".py"):
        return None
    try:
        with open(filename, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def _moved(package: str, name: str, home: str) -> Any:
    warnings.warn(f"{package}.{name} moved to {home}.{name}; import it from there (the old "
                  "name will go away)", DeprecationWarning, stacklevel=3)
    return getattr(importlib.import_module(home), name)


def public_name(package: str, name: str) -> str:
    """The highest namespace that exports ``package``'s ``name`` as the same object: an
    ancestor of ``package`` whose export of ``name`` comes from the same place, or from
    ``package`` itself (``corral`` maps ``Runner`` to ``corral.runs``)."""
    source = _exports(package)[name]
    best = package
    parts = package.split(".")
    for depth in range(len(parts) - 1, 0, -1):
        ancestor = ".".join(parts[:depth])
        mapped = _exports(ancestor).get(name)
        if mapped is not None and (mapped == source or
                                   (mapped[1] == name and _within(mapped[0], best))):
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

