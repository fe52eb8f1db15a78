"""Test kits for corral's contracts, usable by third-party implementations.

Conformance kits are plain async functions taking a factory (modelled on
``trio.testing``'s stream checks): :func:`check_provider`, :func:`check_store`,
:func:`check_session_store` (agent CLIs' saved sessions),
:func:`check_pipe`, :func:`check_reaper`, :func:`check_checkpoint_store` (workspace
checkpoints in a store, #27) and :func:`check_harness` (agent harnesses:
the real CLI in a sandbox against a scripted model server) run every check of their kit, each against a
fresh object from the factory, and raise :class:`KitFailed` naming each failed check.
:func:`pytest_checks` turns a kit into one pytest test per check. :class:`FakeProvider` is
an in-memory provider honest about what it cannot do; :func:`wait_until` and
:func:`wait_until_async` are the one way tests wait for a condition.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral._lazy import lazy_exports

if TYPE_CHECKING:
    from corral.testing._checkpoints import CHECKPOINT_KIT, check_checkpoint_store
    from corral.testing._fake import FakeCommand, FakeProvider
    from corral.testing._kit import (
        Check,
        CheckSkipped,
        Factory,
        Kit,
        KitFailed,
        KitReport,
        raises,
        run_kit,
    )
    from corral.testing._harness import HARNESS_KIT, check_harness
    from corral.testing._harness_world import FEATURES, HarnessCase, HarnessWorld
    from corral.testing._pipe import PIPE_KIT, check_pipe
    from corral.testing._polling import WaitTimeout, wait_until, wait_until_async
    from corral.testing._providers import PROVIDER_KIT, ProviderCase, check_provider
    from corral.testing._reaper import REAPER_KIT, DirSandboxes, ReaperWorld, check_reaper
    from corral.testing._sessions import SESSION_STORE_KIT, check_session_store
    from corral.testing._stores import STORE_KIT, check_store
    from corral.testing._wrappers import pytest_checks

# Names resolve on first use (corral._lazy): importing the package does not import pytest.
_EXPORTS: dict[str, str] = {
    "CHECKPOINT_KIT": "corral.testing._checkpoints",
    "check_checkpoint_store": "corral.testing._checkpoints",
    "FakeCommand": "corral.testing._fake",
    "FakeProvider": "corral.testing._fake",
    "Check": "corral.testing._kit",
    "CheckSkipped": "corral.testing._kit",
    "Factory": "corral.testing._kit",
    "Kit": "corral.testing._kit",
    "KitFailed": "corral.testing._kit",
    "KitReport": "corral.testing._kit",
    "raises": "corral.testing._kit",
    "run_kit": "corral.testing._kit",
    "HARNESS_KIT": "corral.testing._harness",
    "check_harness": "corral.testing._harness",
    "FEATURES": "corral.testing._harness_world",
    "HarnessCase": "corral.testing._harness_world",
    "HarnessWorld": "corral.testing._harness_world",
    "PIPE_KIT": "corral.testing._pipe",
    "check_pipe": "corral.testing._pipe",
    "WaitTimeout": "corral.testing._polling",
    "wait_until": "corral.testing._polling",
    "wait_until_async": "corral.testing._polling",
    "PROVIDER_KIT": "corral.testing._providers",
    "ProviderCase": "corral.testing._providers",
    "check_provider": "corral.testing._providers",
    "REAPER_KIT": "corral.testing._reaper",
    "DirSandboxes": "corral.testing._reaper",
    "ReaperWorld": "corral.testing._reaper",
    "check_reaper": "corral.testing._reaper",
    "SESSION_STORE_KIT": "corral.testing._sessions",
    "check_session_store": "corral.testing._sessions",
    "STORE_KIT": "corral.testing._stores",
    "check_store": "corral.testing._stores",
    "pytest_checks": "corral.testing._wrappers",
}

__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

__all__ = [
    "CHECKPOINT_KIT",
    "Check",
    "CheckSkipped",
    "DirSandboxes",
    "FEATURES",
    "Factory",
    "FakeCommand",
    "FakeProvider",
    "Kit",
    "KitFailed",
    "HARNESS_KIT",
    "HarnessCase",
    "HarnessWorld",
    "KitReport",
    "PIPE_KIT",
    "PROVIDER_KIT",
    "ProviderCase",
    "REAPER_KIT",
    "ReaperWorld",
    "SESSION_STORE_KIT",
    "STORE_KIT",
    "WaitTimeout",
    "check_checkpoint_store",
    "check_harness",
    "check_pipe",
    "check_provider",
    "check_reaper",
    "check_session_store",
    "check_store",
    "pytest_checks",
    "raises",
    "run_kit",
    "wait_until",
    "wait_until_async",
]
