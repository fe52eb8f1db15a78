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

from typing import TYPE_CHECKING

from corral._lazy import lazy_exports

if TYPE_CHECKING:
    from corral._errors import ConfigError, CorralError, PrerequisiteMissing
    from corral.runs import (
        RunRequest,
        Runner,
        RunStartError,
        ReapOutcome,
        ReapResult,
        SandboxReclaimFailedError,
        ThreadBusy,
        ThreadError,
        Threads,
        UnknownThread,
        reap_detached_runs,
        reclaim_sandbox,
        sandbox_reclaimer,
    )
    from corral.providers import ProviderConfig, register_provider
    from corral.sandbox._config_file import dump_config, load_config
    from corral.sandbox._contracts import (
        Capabilities,
        ExecResult,
        Handle,
        Process,
        Provider,
        ResourceLimits,
        SandboxRef,
        SandboxSpec,
        UnsupportedCapability,
    )
    from corral.sandbox._definition import Sandbox
    from corral.sandbox._hooks import FileEvent, Hooks
    from corral.sandbox._key import RunContext
    from corral.sandbox._lifecycle import Lifecycle
    from corral.sandbox._policy import Decision, Policy
    from corral.sandbox._redact import Redactor
    from corral.sandbox._secrets import SecretRef, Secrets
    from corral.sandbox._sources import Files, GitSource, LocalDir, NoSource
    from corral.sandbox._workspace import Parallel, Step, Workspace, parallel
    from corral.stores import open_store
    from corral.stores import (
        LoggedEvent,
        RunExists,
        RunRecord,
        RunStatus,
        StoreError,
        UnknownRun,
    )
    from corral.tools import Toolset, tool

# Names resolve on first use (corral._lazy): the journal supervisor starts a fresh
# interpreter per run and must not import all of corral to get at one module.
_EXPORTS: dict[str, str] = {
    "ConfigError": "corral._errors",
    "CorralError": "corral._errors",
    "PrerequisiteMissing": "corral._errors",
    "dump_config": "corral.sandbox._config_file",
    "load_config": "corral.sandbox._config_file",
    "Capabilities": "corral.sandbox._contracts",
    "ExecResult": "corral.sandbox._contracts",
    "Handle": "corral.sandbox._contracts",
    "Process": "corral.sandbox._contracts",
    "Provider": "corral.sandbox._contracts",
    "ResourceLimits": "corral.sandbox._contracts",
    "SandboxRef": "corral.sandbox._contracts",
    "SandboxSpec": "corral.sandbox._contracts",
    "UnsupportedCapability": "corral.sandbox._contracts",
    "Sandbox": "corral.sandbox._definition",
    "FileEvent": "corral.sandbox._hooks",
    "Hooks": "corral.sandbox._hooks",
    "RunContext": "corral.sandbox._key",
    "Lifecycle": "corral.sandbox._lifecycle",
    "Decision": "corral.sandbox._policy",
    "Policy": "corral.sandbox._policy",
    "Redactor": "corral.sandbox._redact",
    "SecretRef": "corral.sandbox._secrets",
    "Secrets": "corral.sandbox._secrets",
    "Files": "corral.sandbox._sources",
    "GitSource": "corral.sandbox._sources",
    "LocalDir": "corral.sandbox._sources",
    "NoSource": "corral.sandbox._sources",
    "Parallel": "corral.sandbox._workspace",
    "Step": "corral.sandbox._workspace",
    "Workspace": "corral.sandbox._workspace",
    "parallel": "corral.sandbox._workspace",
    "open_store": "corral.stores",
    "LoggedEvent": "corral.stores",
    "RunExists": "corral.stores",
    "StoreError": "corral.stores",
    "UnknownRun": "corral.stores",
    "RunRecord": "corral.stores",
    "RunStatus": "corral.stores",
    "register_provider": "corral.providers",
    "ProviderConfig": "corral.providers",
    "Toolset": "corral.tools",
    "tool": "corral.tools",
    "RunRequest": "corral.runs",
    "RunStartError": "corral.runs",
    "Runner": "corral.runs",
    "ReapOutcome": "corral.runs",
    "ReapResult": "corral.runs",
    "SandboxReclaimFailedError": "corral.runs",
    "reap_detached_runs": "corral.runs",
    "reclaim_sandbox": "corral.runs",
    "sandbox_reclaimer": "corral.runs",
    "ThreadBusy": "corral.runs",
    "ThreadError": "corral.runs",
    "Threads": "corral.runs",
    "UnknownThread": "corral.runs",
}


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

from corral._version import __version__  # noqa: E402

__all__ = [
    "Capabilities",
    "ConfigError",
    "CorralError",
    "Decision",
    "ExecResult",
    "FileEvent",
    "Files",
    "GitSource",
    "Handle",
    "Hooks",
    "Lifecycle",
    "LocalDir",
    "LoggedEvent",
    "NoSource",
    "Parallel",
    "Policy",
    "PrerequisiteMissing",
    "Process",
    "Provider",
    "ReapOutcome",
    "ReapResult",
    "Redactor",
    "ResourceLimits",
    "RunContext",
    "RunExists",
    "RunRecord",
    "RunRequest",
    "RunStartError",
    "RunStatus",
    "Runner",
    "Sandbox",
    "SandboxReclaimFailedError",
    "SandboxRef",
    "SandboxSpec",
    "SecretRef",
    "Secrets",
    "Step",
    "StoreError",
    "ThreadBusy",
    "ThreadError",
    "Threads",
    "Toolset",
    "UnknownRun",
    "UnknownThread",
    "UnsupportedCapability",
    "Workspace",
    "__version__",
    "dump_config",
    "load_config",
    "open_store",
    "parallel",
    "reap_detached_runs",
    "reclaim_sandbox",
    "register_provider",
    "ProviderConfig",
    "sandbox_reclaimer",
    "tool",
]
