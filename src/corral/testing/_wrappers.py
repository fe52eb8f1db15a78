"""Thin pytest wrappers: one named pytest test per check of a kit.

In a test module::

    from corral.testing import STORE_KIT, pytest_checks

    pytest_checks(STORE_KIT, {"memory": make_memory_store, "sqlite": make_sqlite_store},
                  globals())

defines ``test_<check>`` for every check, parametrized over the factories, so a failure
names the check and the implementation. The tests are ``@pytest.mark.anyio``: they run on
whatever ``anyio_backend`` the module's fixtures choose.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

import pytest

from corral.testing._kit import Check, CheckSkipped, Factory, Kit, run_check

__all__ = ["pytest_checks"]


def pytest_checks(
    kit: Kit[Any],
    factory: Factory | Mapping[str, Factory],
    namespace: MutableMapping[str, Any],
    *,
    prefix: str = "test_",
    usefixtures: Sequence[str] = (),
    marks: Sequence[pytest.MarkDecorator] = (),
    **options: Any,
) -> list[str]:
    """Define one pytest test per check of ``kit`` in ``namespace`` (pass ``globals()``).

    ``factory`` is one factory, or several by name (each test is parametrized over them,
    the name as its id). ``usefixtures`` names fixtures every test needs before the
    factory runs (a private ``$CORRAL_HOME``, a prerequisite check); ``marks`` are added
    to every test; ``options`` go to the kit (see each ``check_*`` function). A check that
    raises :class:`CheckSkipped` is a pytest skip with its reason. Returns the test names.
    """
    names: list[str] = []
    for chk in kit.checks:
        name = prefix + chk.name
        if name in namespace:
            raise ValueError(f"{name} is already defined in {namespace.get('__name__')}")
        test = _test_for(kit, chk, factory, options)
        test.__name__ = test.__qualname__ = name
        test.__module__ = str(namespace.get("__name__", test.__module__))
        test.__doc__ = chk.doc or None
        decorated: Any = pytest.mark.anyio(test)
        if usefixtures:
            decorated = pytest.mark.usefixtures(*usefixtures)(decorated)
        for mark in marks:
            decorated = mark(decorated)
        namespace[name] = decorated
        names.append(name)
    return names


def _test_for(
    kit: Kit[Any], chk: Check[Any], factory: Factory | Mapping[str, Factory],
    options: dict[str, Any],
) -> Any:
    async def run(one: Factory) -> None:
        try:
            await run_check(kit, chk, one, **options)
        except CheckSkipped as exc:
            pytest.skip(str(exc))

    if not isinstance(factory, Mapping):
        single = factory

        async def test() -> None:
            await run(single)

        return test

    ids = list(factory)

    async def test_each(implementation: str) -> None:
        await run(factory[implementation])

    return pytest.mark.parametrize("implementation", ids)(test_each)
