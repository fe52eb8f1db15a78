"""Provider calls that corral makes, each in an OpenTelemetry span (``sandbox.create``,
``sandbox.exec``, ``sandbox.destroy``; no-ops without ``corral[otel]``). One place for the
span names and attributes, so every caller (ensure, release, gc, the reaper, reclaim)
reports the same way."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol

from corral._telemetry import span
from corral.sandbox._contracts import Handle, Provider, SandboxRef, SandboxSpec


class Destroys(Protocol):
    """Any provider, or a part of one that can only destroy (gc's, reclaim's)."""

    @property
    def name(self) -> str: ...

    async def destroy(self, ref: Any) -> None: ...


def _ref_id(ref: SandboxRef | str) -> str:
    return ref if isinstance(ref, str) else ref.id


async def create(provider: Provider, spec: SandboxSpec | None) -> Handle:
    """``provider.create(spec)`` in a ``sandbox.create`` span."""
    with span("sandbox.create", {"corral.sandbox.provider": provider.name}) as current:
        handle = await provider.create(spec)
        if current is not None:
            current.set_attribute("corral.sandbox.id", handle.id)
        return handle


async def destroy(provider: Destroys, ref: SandboxRef | str, *, reason: str) -> None:
    """``provider.destroy(ref)`` in a ``sandbox.destroy`` span; ``reason`` says which part
    of corral destroys it (``release``, ``gc``, ``reaper``, ...)."""
    with span("sandbox.destroy", {"corral.sandbox.provider": provider.name,
                                  "corral.sandbox.id": _ref_id(ref),
                                  "corral.sandbox.reason": reason}):
        await provider.destroy(ref)


@contextlib.contextmanager
def exec_span(handle: Handle, what: str, **attributes: Any) -> Iterator[None]:
    """A ``sandbox.exec`` span around a command corral runs in the sandbox (``what``: e.g.
    ``setup``)."""
    with span("sandbox.exec", {"corral.sandbox.id": handle.id, "corral.sandbox.exec": what,
                               **{f"corral.sandbox.{k}": v for k, v in attributes.items()}}):
        yield
