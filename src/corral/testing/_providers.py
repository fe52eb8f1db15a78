"""Provider conformance kit: the sandbox contract (DESIGN §2), as plain checks.

    from corral.testing import check_provider

    await check_provider(MyProvider)                       # raises KitFailed naming failures
    await check_provider(MyProvider, import_path="my_pkg.providers:MyProvider")

``make_provider`` makes the provider (see :mod:`corral.testing._kit` for the factory
forms); every check gets a fresh one. ``import_path`` ("module:callable", called without
arguments) is how a second Python process builds the same provider; it defaults to the
provider's class. The provider must find its state through the environment
(``$CORRAL_HOME`` or its own config) so that the second process sees the same sandboxes.

Checks branch on the declared :class:`~corral.sandbox._contracts.Capabilities`: a missing
capability must raise :class:`~corral.sandbox._contracts.UnsupportedCapability`, a declared
one is verified, and a check about a capability the provider does not declare is skipped
with that reason (:class:`~corral.testing.CheckSkipped`), never silently passed. Most checks
run POSIX shell commands (``sh``, coreutils) inside the sandbox; a provider that runs no
shell (such as :class:`~corral.testing.FakeProvider`) passes ``posix_shell=False``, and those
checks are skipped or keep to the filesystem part.
"""

from __future__ import annotations

from collections.abc import Iterable

from corral.testing._kit import Factory, Kit, KitReport
from corral.testing._provider_case import ProviderCase, provider_case
from corral.testing._provider_files import FILE_CHECKS
from corral.testing._provider_host import HOST_CHECKS
from corral.testing._provider_lifecycle import LIFECYCLE_CHECKS
from corral.testing._provider_processes import PROCESS_CHECKS

__all__ = ["PROVIDER_KIT", "check_provider"]

PROVIDER_KIT: Kit[ProviderCase] = Kit("provider", (
    *PROCESS_CHECKS.checks, *FILE_CHECKS.checks, *LIFECYCLE_CHECKS.checks, *HOST_CHECKS.checks,
), subject=provider_case)
"""Every provider check, one part (``_provider_processes``, ``_provider_files``,
``_provider_lifecycle``, ``_provider_host``) after another; the subject is a
:class:`ProviderCase` (``_provider_case``)."""


async def check_provider(
    make_provider: Factory,
    *,
    import_path: str | None = None,
    posix_shell: bool = True,
    only: Iterable[str] | None = None,
) -> KitReport:
    """Run the provider kit (one fresh provider per check); raise
    :class:`~corral.testing.KitFailed` naming every failed check, else return the report
    (its ``skipped`` says which checks the declared capabilities excused)."""
    return await PROVIDER_KIT.verify(make_provider, only=only, import_path=import_path,
                           posix_shell=posix_shell)
