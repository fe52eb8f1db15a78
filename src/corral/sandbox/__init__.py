"""Sandbox definitions and the sandbox contract.

A :class:`Sandbox` is provider + :class:`Workspace` + :class:`Policy` + :class:`Lifecycle`
(+ :class:`Hooks`); ``ensure`` resumes, restores or creates and bootstraps its instance. The
contract every provider and handle offers (DESIGN §2) is :class:`Provider`, :class:`Handle`,
:class:`Process`, :class:`Capabilities` and the refs and specs around them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral._lazy import lazy_exports

if TYPE_CHECKING:
    from corral.sandbox._bootstrap import BootstrapResult, bootstrap
    from corral.sandbox._config_file import dump_config, find_config, load_config
    from corral.sandbox._contracts import (
        Capabilities,
        ExecResult,
        FileInfo,
        FileSystem,
        Handle,
        HostCommand,
        HostRoute,
        PathEscapeError,
        Process,
        ProcessApi,
        Provider,
        ResourceLimits,
        SandboxGoneError,
        SandboxRef,
        SandboxSpec,
        SnapshotRef,
        UnsupportedCapability,
    )
    from corral.sandbox._definition import Sandbox
    from corral.sandbox._ensure import Ensured
    from corral.sandbox._gc import GcReport, collect_idle
    from corral.sandbox._gitsrc import GitError
    from corral.sandbox._hooks import FileEvent, Hooks
    from corral.sandbox._key import RunContext
    from corral.sandbox._lifecycle import Lifecycle
    from corral.sandbox._policy import Decision, Policy
    from corral.sandbox._redact import Redactor
    from corral.sandbox._secrets import SecretRef, Secrets
    from corral.sandbox._setup_shell import SetupError
    from corral.sandbox._sources import Files, GitSource, LocalDir, NoSource
    from corral.sandbox._transfer import CopyTooLarge, TransferError, copy_dir_into
    from corral.sandbox._workspace import Parallel, Step, Workspace, parallel

# Names resolve on first use (corral._lazy).
_EXPORTS: dict[str, str] = {
    "BootstrapResult": "corral.sandbox._bootstrap",
    "bootstrap": "corral.sandbox._bootstrap",
    "dump_config": "corral.sandbox._config_file",
    "find_config": "corral.sandbox._config_file",
    "load_config": "corral.sandbox._config_file",
    "Capabilities": "corral.sandbox._contracts",
    "ExecResult": "corral.sandbox._contracts",
    "FileInfo": "corral.sandbox._contracts",
    "FileSystem": "corral.sandbox._contracts",
    "Handle": "corral.sandbox._contracts",
    "HostCommand": "corral.sandbox._contracts",
    "HostRoute": "corral.sandbox._contracts",
    "PathEscapeError": "corral.sandbox._contracts",
    "Process": "corral.sandbox._contracts",
    "ProcessApi": "corral.sandbox._contracts",
    "Provider": "corral.sandbox._contracts",
    "ResourceLimits": "corral.sandbox._contracts",
    "SandboxGoneError": "corral.sandbox._contracts",
    "SandboxRef": "corral.sandbox._contracts",
    "SandboxSpec": "corral.sandbox._contracts",
    "SnapshotRef": "corral.sandbox._contracts",
    "UnsupportedCapability": "corral.sandbox._contracts",
    "Sandbox": "corral.sandbox._definition",
    "Ensured": "corral.sandbox._ensure",
    "GcReport": "corral.sandbox._gc",
    "collect_idle": "corral.sandbox._gc",
    "GitError": "corral.sandbox._gitsrc",
    "FileEvent": "corral.sandbox._hooks",
    "Hooks": "corral.sandbox._hooks",
    "RunContext": "corral.sandbox._key",
    "Lifecycle": "corral.sandbox._lifecycle",
    "Decision": "corral.sandbox._policy",
    "Policy": "corral.sandbox._policy",
    "Redactor": "corral.sandbox._redact",
    "SecretRef": "corral.sandbox._secrets",
    "Secrets": "corral.sandbox._secrets",
    "SetupError": "corral.sandbox._setup_shell",
    "Files": "corral.sandbox._sources",
    "GitSource": "corral.sandbox._sources",
    "LocalDir": "corral.sandbox._sources",
    "NoSource": "corral.sandbox._sources",
    "CopyTooLarge": "corral.sandbox._transfer",
    "TransferError": "corral.sandbox._transfer",
    "copy_dir_into": "corral.sandbox._transfer",
    "Parallel": "corral.sandbox._workspace",
    "Step": "corral.sandbox._workspace",
    "Workspace": "corral.sandbox._workspace",
    "parallel": "corral.sandbox._workspace",
}

__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

__all__ = [
    "BootstrapResult",
    "Capabilities",
    "CopyTooLarge",
    "Decision",
    "Ensured",
    "ExecResult",
    "FileEvent",
    "FileInfo",
    "FileSystem",
    "Files",
    "GcReport",
    "GitError",
    "GitSource",
    "Handle",
    "Hooks",
    "HostCommand",
    "HostRoute",
    "Lifecycle",
    "LocalDir",
    "NoSource",
    "Parallel",
    "PathEscapeError",
    "Policy",
    "Process",
    "ProcessApi",
    "Provider",
    "Redactor",
    "ResourceLimits",
    "RunContext",
    "Sandbox",
    "SandboxGoneError",
    "SandboxRef",
    "SandboxSpec",
    "SecretRef",
    "Secrets",
    "SetupError",
    "SnapshotRef",
    "Step",
    "TransferError",
    "UnsupportedCapability",
    "Workspace",
    "bootstrap",
    "collect_idle",
    "copy_dir_into",
    "dump_config",
    "find_config",
    "load_config",
    "parallel",
]
