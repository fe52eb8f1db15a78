"""corral: run coding-agent CLIs in isolated sandboxes, stream AG-UI events, keep runs durable.

What a user writes first lives here: the sandbox definition (:class:`Sandbox`,
:class:`Workspace`, :class:`Policy`, :class:`Lifecycle`, :class:`Secrets`, …), the
:class:`Runner` that starts, attaches to and cancels runs (:class:`RunRequest`), the store
(:func:`open_store`), host tools (:func:`tool`, :class:`Toolset`), the reaper
(:func:`reap_detached_runs`) and reclaimer (:func:`reclaim_sandbox`,
:func:`sandbox_reclaimer`), the provider registry (:func:`register_provider`) and the errors.
Protocols are in ``corral.abc``, conformance kits in ``corral.testing``; every other module is
private.
"""

from __future__ import annotations

from corral._lazy import TYPE_CHECKING, lazy_namespace

# Protocols live in corral.abc only: their old names here resolve with a warning
_MOVED = dict.fromkeys(("Handle", "Process", "Provider"), "corral.abc")

# The public names, listed once: resolved on first use (corral._lazy)
if TYPE_CHECKING or not lazy_namespace(globals(), moved=_MOVED):
    from corral._errors import (
        ConfigError as ConfigError,
        CorralError as CorralError,
        PrerequisiteMissing as PrerequisiteMissing,
    )
    from corral._version import __version__ as __version__
    from corral.runs import (
        RunRequest as RunRequest,
        Runner as Runner,
        RunStartError as RunStartError,
        ReapOutcome as ReapOutcome,
        ReapResult as ReapResult,
        SandboxReclaimFailedError as SandboxReclaimFailedError,
        ThreadBusy as ThreadBusy,
        ThreadError as ThreadError,
        Threads as Threads,
        UnknownThread as UnknownThread,
        reap_detached_runs as reap_detached_runs,
        reclaim_sandbox as reclaim_sandbox,
        sandbox_reclaimer as sandbox_reclaimer,
    )
    from corral.providers import (
        ProviderConfig as ProviderConfig,
        register_provider as register_provider,
    )
    from corral.sandbox._config_file import (
        dump_config as dump_config,
        load_config as load_config,
    )
    from corral.sandbox._contracts import (
        Capabilities as Capabilities,
        ExecResult as ExecResult,
        ResourceLimits as ResourceLimits,
        SandboxRef as SandboxRef,
        SandboxSpec as SandboxSpec,
        UnsupportedCapability as UnsupportedCapability,
    )
    from corral.sandbox._definition import Sandbox as Sandbox
    from corral.sandbox._hooks import (
        FileEvent as FileEvent,
        Hooks as Hooks,
    )
    from corral.sandbox._key import RunContext as RunContext
    from corral.sandbox._lifecycle import Lifecycle as Lifecycle
    from corral.policy._policy import (
        Decision as Decision,
        Policy as Policy,
    )
    from corral.sandbox._redact import Redactor as Redactor
    from corral.sandbox._secrets import (
        SecretRef as SecretRef,
        Secrets as Secrets,
    )
    from corral.sandbox._sources import (
        Files as Files,
        GitSource as GitSource,
        LocalDir as LocalDir,
        NoSource as NoSource,
    )
    from corral.sandbox._workspace import (
        Parallel as Parallel,
        Step as Step,
        Workspace as Workspace,
        parallel as parallel,
    )
    from corral.stores import (
        open_store as open_store,
        LoggedEvent as LoggedEvent,
        RunExists as RunExists,
        RunRecord as RunRecord,
        RunStatus as RunStatus,
        StoreError as StoreError,
        UnknownRun as UnknownRun,
    )
    from corral.tools import (
        Toolset as Toolset,
        tool as tool,
    )
