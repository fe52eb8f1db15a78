"""Tearing down the sandbox a finished run was bound to.

Two orderings matter:

- The provider check comes before anything else. An instance record written by another
  provider names a sandbox id in that provider's namespace; handing it to this provider's
  ``destroy`` could hit an unrelated sandbox. A mismatch therefore touches nothing, not even
  the instance record, which the right provider still needs.
- ``destroy`` comes before the record is deleted, and the record is deleted whether or not
  ``destroy`` worked. A record that points at a dead sandbox makes the thread's next turn fail
  to resume; an orphaned sandbox is a bounded cost the provider's own collection can recover.
  A failed destroy is still reported as its own outcome, because it may be a live sandbox
  nothing points at any more.

Teardown runs under its own time bound, never under the run's abort: an already-fired abort
would make a provider skip the destroy, after which the only pointer to the sandbox is gone.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable
from typing import Final, Protocol

import anyio

from corral._errors import CorralError
from corral._log import library_logger
from corral.stores._records import RunRecord
from corral.stores._protocols import InstanceStore
from corral.sandbox._contracts import SandboxRef
from corral.sandbox import _traced as traced

__all__ = [
    "DEFAULT_DESTROY_TIMEOUT",
    "ReclaimOutcome",
    "ReclaimProvider",
    "SandboxReclaimFailedError",
    "reclaim_sandbox",
    "sandbox_reclaimer",
]

log = library_logger("corral.runs._reclaim")

DEFAULT_DESTROY_TIMEOUT: Final = 60.0
"""Seconds one ``destroy`` may take before it counts as failed."""


class ReclaimOutcome(enum.StrEnum):
    """What :func:`reclaim_sandbox` did."""

    DESTROYED = "destroyed"
    """The provider destroyed the sandbox and the instance record is gone."""
    DESTROY_FAILED = "destroy-failed"
    """``destroy`` raised or timed out; the instance record was deleted anyway, so the
    sandbox, if it still exists, is no longer reachable from the store."""
    NO_SANDBOX_KEY = "no-sandbox-key"
    """The run names no sandbox instance."""
    NOT_FOUND = "not-found"
    """No instance record under the run's key (already reclaimed, or never recorded)."""
    PROVIDER_MISMATCH = "provider-mismatch"
    """The instance belongs to another provider; nothing was touched."""


class ReclaimProvider(Protocol):
    """What reclaiming needs from a provider: its name and an idempotent ``destroy``."""

    @property
    def name(self) -> str: ...

    async def destroy(self, ref: SandboxRef) -> None: ...


class SandboxReclaimFailedError(CorralError):
    """The provider failed to destroy a finished run's sandbox (raised by the callable
    :func:`sandbox_reclaimer` returns, so a sweep reports the run as ``reclaim-failed``)."""

    def __init__(self, run_id: str, sandbox_key: str | None, cause: str = "") -> None:
        key = f" {sandbox_key!r}" if sandbox_key is not None else ""
        super().__init__(
            f"reclaiming the sandbox of run {run_id!r} failed: the provider could not destroy "
            f"it{(': ' + cause) if cause else ''}; its instance record{key} was deleted anyway, "
            "so the sandbox may still be running; remove it with `corral sandboxes rm`"
        )
        self.run_id = run_id
        self.sandbox_key = sandbox_key
        self.cause = cause


async def _reclaim(
    record: RunRecord,
    provider: ReclaimProvider,
    instances: InstanceStore,
    destroy_timeout: float,
    logger: logging.Logger,
) -> tuple[ReclaimOutcome, str]:
    key = record.sandbox_key
    if key is None:
        return ReclaimOutcome.NO_SANDBOX_KEY, ""
    # Not guarded: a store failure is the caller's to record (the reaper: reclaim-failed).
    instance = await instances.get_instance(key)
    if instance is None:
        return ReclaimOutcome.NOT_FOUND, ""
    if instance.provider != provider.name:
        logger.warning(
            "reclaim: run %s: instance %r belongs to provider %r, not %r; leaving it alone",
            record.run_id, key, instance.provider, provider.name,
        )
        return ReclaimOutcome.PROVIDER_MISMATCH, ""
    cause = ""
    try:
        with anyio.fail_after(destroy_timeout):
            await traced.destroy(provider, SandboxRef(provider.name, instance.provider_sandbox_id),
                                 reason="reclaim")
    except TimeoutError:
        cause = f"destroy did not finish within {destroy_timeout:g}s"
    except Exception as exc:  # noqa: BLE001 - reported as destroy-failed, record still deleted
        cause = str(exc) or type(exc).__name__
    if cause:
        logger.warning(
            "reclaim: run %s: destroying sandbox %s failed (%s); deleting the instance record "
            "anyway", record.run_id, instance.provider_sandbox_id, cause,
        )
    await instances.delete_instance(key)
    return (ReclaimOutcome.DESTROY_FAILED if cause else ReclaimOutcome.DESTROYED), cause


async def reclaim_sandbox(
    record: RunRecord,
    *,
    provider: ReclaimProvider,
    instances: InstanceStore,
    destroy_timeout: float = DEFAULT_DESTROY_TIMEOUT,
    logger: logging.Logger | None = None,
) -> ReclaimOutcome:
    """Destroy the sandbox ``record`` is bound to and delete its instance record.

    Order: no ``sandbox_key`` → ``no-sandbox-key``; no instance record → ``not-found``;
    instance of another provider → ``provider-mismatch`` (nothing touched); else destroy
    (bounded by ``destroy_timeout``), delete the instance record regardless, and answer
    ``destroyed`` or ``destroy-failed``. Instance-store failures propagate.
    """
    outcome, _ = await _reclaim(record, provider, instances, destroy_timeout, logger or log)
    return outcome


def sandbox_reclaimer(
    provider: ReclaimProvider,
    instances: InstanceStore,
    *,
    destroy_timeout: float = DEFAULT_DESTROY_TIMEOUT,
    logger: logging.Logger | None = None,
) -> Callable[[RunRecord], Awaitable[ReclaimOutcome]]:
    """A ``reclaim`` callable for :func:`corral.runs.reap_detached_runs`.

    It raises :class:`SandboxReclaimFailedError` on ``destroy-failed``: the sweep's only way
    to learn that a sandbox was *not* torn down is an exception, which it reports as
    ``reclaim-failed`` with the run's status and exit code intact. The other outcomes mean
    there is nothing for this provider to tear down and are returned.
    """
    logger = logger or log

    async def reclaim(record: RunRecord) -> ReclaimOutcome:
        outcome, cause = await _reclaim(record, provider, instances, destroy_timeout, logger)
        if outcome is ReclaimOutcome.DESTROY_FAILED:
            logger.error(
                "reclaim: run %s: sandbox %r may still be running", record.run_id,
                record.sandbox_key,
            )
            raise SandboxReclaimFailedError(record.run_id, record.sandbox_key, cause)
        logger.debug("reclaim: run %s: %s", record.run_id, outcome.value)
        return outcome

    return reclaim
