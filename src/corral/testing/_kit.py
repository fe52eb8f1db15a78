"""Conformance kits as plain functions (modelled on ``trio.testing``'s stream checks).

A *check* is an ``async def check_<name>(subject) -> None`` that raises ``AssertionError``
(or any exception) when the implementation under test breaks the contract, and
:class:`CheckSkipped` when the contract promises nothing to check (a capability the
implementation does not declare). A :class:`Kit` is a named list of checks plus how to
build one fresh *subject* (a store, a provider case, a reaper world) from the user's
*factory* for each check, and how to tear it down afterwards; a kit's module adds each
check to it with ``@KIT.add``.

A factory is a zero-argument callable returning the object, an awaitable of it, or an
async context manager yielding it (use that form to own setup and cleanup, e.g. a
temporary directory for a database file). An object made by the first two forms is closed
with its ``aclose()`` when it has one.

The kits need no test framework: :func:`run_kit` runs every check and returns a
:class:`KitReport`; :meth:`Kit.verify`, behind the ``check_*`` entry points
(``check_store`` …), raises :class:`KitFailed` naming each failed check. ``corral.testing.pytest_checks`` turns a kit
into one pytest test per check.
"""

from __future__ import annotations

import inspect
import re
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

__all__ = [
    "Check",
    "CheckSkipped",
    "Factory",
    "Kit",
    "KitFailed",
    "KitReport",
    "Raised",
    "check",
    "opened",
    "raises",
    "run_check",
    "run_kit",
]

T = TypeVar("T")
S = TypeVar("S")
E = TypeVar("E", bound=BaseException)

Factory = Callable[[], Any]
"""Makes the implementation under test: returns it, an awaitable of it, or an async context
manager yielding it."""


class CheckSkipped(Exception):
    """Raised by a check when there is nothing to verify (the reason says why)."""


class KitFailed(AssertionError):
    """One or more checks of a kit failed; ``report`` holds every outcome."""

    def __init__(self, report: KitReport) -> None:
        self.report = report
        lines = [f"{report.kit}: {len(report.failed)} of {len(report.outcomes)} checks failed"]
        for name, error in report.failed.items():
            lines.append(f"  {name}: {error}")
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class Check(Generic[S]):
    """One named conformance check."""

    name: str
    fn: Callable[[S], Awaitable[None]]
    doc: str = ""


def check(fn: Callable[[S], Awaitable[None]]) -> Check[S]:
    """Wrap ``async def check_<name>(subject)`` as a :class:`Check` called ``<name>``."""
    name = fn.__name__.removeprefix("check_")
    return Check(name, fn, inspect.getdoc(fn) or "")


@asynccontextmanager
async def opened(factory: Factory) -> AsyncIterator[Any]:
    """Make one object with ``factory`` (see the module docstring) and clean it up."""
    made = factory()
    if hasattr(made, "__aenter__") and hasattr(made, "__aexit__"):
        async with made as obj:
            yield obj
        return
    if inspect.isawaitable(made):
        made = await made
    try:
        yield made
    finally:
        aclose = getattr(made, "aclose", None)
        if callable(aclose):
            await aclose()


@dataclass
class Kit(Generic[S]):
    """A named set of checks and how to build each check's subject from a factory.

    ``subject(factory, **options)`` is an async context manager yielding a fresh subject;
    every check gets its own. A kit's module makes the kit before its checks and marks each
    one ``@KIT.add``, so the kit holds them in the order they are written and a new check
    cannot be left out.
    """

    name: str
    checks: tuple[Check[S], ...] = ()
    subject: Callable[..., AbstractAsyncContextManager[S]] = opened

    def add(self, fn: Callable[[S], Awaitable[None]]) -> Callable[[S], Awaitable[None]]:
        """Decorator: add ``async def check_<name>(subject)`` to this kit, last (see
        :func:`check`); the function is returned unchanged."""
        self.checks = (*self.checks, check(fn))
        return fn

    def select(self, only: Iterable[str] | None = None) -> tuple[Check[S], ...]:
        """The checks named in ``only`` (all when ``None``); an unknown name is an error."""
        if only is None:
            return self.checks
        wanted = list(only)
        known = {c.name for c in self.checks}
        unknown = [n for n in wanted if n not in known]
        if unknown:
            raise ValueError(f"{self.name} has no check named {', '.join(unknown)}")
        return tuple(c for c in self.checks if c.name in wanted)

    async def verify(self, factory: Factory, *, only: Iterable[str] | None = None,
                     **options: Any) -> KitReport:
        """Run every check (or those named in ``only``) on subjects made from ``factory``
        (one fresh subject per check; ``options`` go to :attr:`subject`); raise
        :class:`KitFailed` naming every failed check, else return the report (its
        ``skipped`` says which checks had nothing to verify). What each kit's ``check_*``
        entry point does."""
        report = await run_kit(self, factory, only=only, **options)
        return report.raise_for_failures()


@dataclass
class KitReport:
    """What a kit run found: each check's outcome (``passed``, ``skipped: …``, or the
    failure's one-line description) and the failures' tracebacks."""

    kit: str
    outcomes: dict[str, str] = field(default_factory=dict)
    tracebacks: dict[str, str] = field(default_factory=dict)

    @property
    def passed(self) -> list[str]:
        return [n for n, o in self.outcomes.items() if o == "passed"]

    @property
    def skipped(self) -> dict[str, str]:
        return {n: o.removeprefix("skipped: ") for n, o in self.outcomes.items()
                if o.startswith("skipped: ")}

    @property
    def failed(self) -> dict[str, str]:
        return {n: o for n, o in self.outcomes.items()
                if o != "passed" and not o.startswith("skipped: ")}

    def raise_for_failures(self) -> KitReport:
        """Raise :class:`KitFailed` if any check failed; else return the report."""
        if self.failed:
            raise KitFailed(self)
        return self


async def run_check(kit: Kit[S], chk: Check[S], factory: Factory, **options: Any) -> None:
    """Run one check against a fresh subject; its exceptions propagate."""
    async with kit.subject(factory, **options) as subject:
        await chk.fn(subject)


async def run_kit(
    kit: Kit[S], factory: Factory, *, only: Iterable[str] | None = None, **options: Any
) -> KitReport:
    """Run every check (or those named in ``only``), each on a fresh subject, and report.
    A failing check does not stop the others; cancellation does."""
    report = KitReport(kit.name)
    for chk in kit.select(only):
        try:
            await run_check(kit, chk, factory, **options)
        except CheckSkipped as exc:
            report.outcomes[chk.name] = f"skipped: {exc}"
        except Exception as exc:  # a failed check is reported, the kit goes on
            report.outcomes[chk.name] = f"{type(exc).__name__}: {exc}".splitlines()[0]
            report.tracebacks[chk.name] = "".join(traceback.format_exception(exc))
        else:
            report.outcomes[chk.name] = "passed"
    return report


class Raised(Generic[E]):
    """What :func:`raises` caught (``value``), as ``pytest.raises`` gives it."""

    value: E


@contextmanager
def raises(
    expected: type[E] | tuple[type[E], ...], *, match: str | None = None
) -> Iterator[Raised[E]]:
    """Fail unless the block raises ``expected`` (whose message matches ``match``, a regular
    expression searched for); other exceptions propagate. A framework-free
    ``pytest.raises``."""
    info: Raised[E] = Raised()
    try:
        yield info
    except expected as exc:
        if match is not None and not re.search(match, str(exc)):
            raise AssertionError(f"{type(exc).__name__}({str(exc)!r}) does not match {match!r}")\
                from exc
        info.value = exc
        return
    names = expected.__name__ if isinstance(expected, type) else \
        " or ".join(e.__name__ for e in expected)
    raise AssertionError(f"did not raise {names}")
