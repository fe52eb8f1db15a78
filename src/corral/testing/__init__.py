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

from corral._lazy import TYPE_CHECKING, lazy_namespace

# The public names, listed once: resolved on first use (corral._lazy)
if TYPE_CHECKING or not lazy_namespace(globals()):
    from corral.testing._checkpoints import (
        CHECKPOINT_KIT as CHECKPOINT_KIT,
        check_checkpoint_store as check_checkpoint_store,
    )
    from corral.testing._fake import (
        FakeCommand as FakeCommand,
        FakeProvider as FakeProvider,
    )
    from corral.testing._kit import (
        Check as Check,
        CheckSkipped as CheckSkipped,
        Factory as Factory,
        Kit as Kit,
        KitFailed as KitFailed,
        KitReport as KitReport,
        raises as raises,
        run_kit as run_kit,
    )
    from corral.testing._harness import (
        HARNESS_KIT as HARNESS_KIT,
        check_harness as check_harness,
    )
    from corral.testing._harness_world import (
        FEATURES as FEATURES,
        HarnessCase as HarnessCase,
        HarnessWorld as HarnessWorld,
    )
    from corral.testing._pipe import (
        PIPE_KIT as PIPE_KIT,
        check_pipe as check_pipe,
    )
    from corral.testing._polling import (
        WaitTimeout as WaitTimeout,
        wait_until as wait_until,
        wait_until_async as wait_until_async,
    )
    from corral.testing._provider_case import ProviderCase as ProviderCase
    from corral.testing._providers import (
        PROVIDER_KIT as PROVIDER_KIT,
        check_provider as check_provider,
    )
    from corral.testing._reaper import (
        REAPER_KIT as REAPER_KIT,
        check_reaper as check_reaper,
    )
    from corral.testing._reaper_world import (
        DirSandboxes as DirSandboxes,
        ReaperWorld as ReaperWorld,
    )
    from corral.testing._sessions import (
        SESSION_STORE_KIT as SESSION_STORE_KIT,
        check_session_store as check_session_store,
    )
    from corral.testing._stores import (
        STORE_KIT as STORE_KIT,
        check_store as check_store,
    )
    from corral.testing._wrappers import pytest_checks as pytest_checks
