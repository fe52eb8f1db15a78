"""corral: run coding-agent CLIs in isolated sandboxes, stream AG-UI events, keep runs durable."""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral._lazy import lazy_exports

if TYPE_CHECKING:
    from corral.errors import ConfigError, CorralError, PrerequisiteMissing
    from corral.sandbox.config_file import dump_config, load_config
    from corral.sandbox.contracts import (
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
    from corral.sandbox.definition import Sandbox
    from corral.sandbox.hooks import FileEvent, Hooks
    from corral.sandbox.key import RunContext
    from corral.sandbox.lifecycle import Lifecycle
    from corral.sandbox.policy import Decision, Policy
    from corral.sandbox.redact import Redactor
    from corral.sandbox.secrets import SecretRef, Secrets
    from corral.sandbox.sources import Files, GitSource, LocalDir, NoSource
    from corral.sandbox.workspace import Parallel, Step, Workspace, parallel

# Names resolve on first use (corral._lazy).
_EXPORTS: dict[str, str] = {
    "ConfigError": "corral.errors",
    "CorralError": "corral.errors",
    "PrerequisiteMissing": "corral.errors",
    "dump_config": "corral.sandbox.config_file",
    "load_config": "corral.sandbox.config_file",
    "Capabilities": "corral.sandbox.contracts",
    "ExecResult": "corral.sandbox.contracts",
    "Handle": "corral.sandbox.contracts",
    "Process": "corral.sandbox.contracts",
    "Provider": "corral.sandbox.contracts",
    "ResourceLimits": "corral.sandbox.contracts",
    "SandboxRef": "corral.sandbox.contracts",
    "SandboxSpec": "corral.sandbox.contracts",
    "UnsupportedCapability": "corral.sandbox.contracts",
    "Sandbox": "corral.sandbox.definition",
    "FileEvent": "corral.sandbox.hooks",
    "Hooks": "corral.sandbox.hooks",
    "RunContext": "corral.sandbox.key",
    "Lifecycle": "corral.sandbox.lifecycle",
    "Decision": "corral.sandbox.policy",
    "Policy": "corral.sandbox.policy",
    "Redactor": "corral.sandbox.redact",
    "SecretRef": "corral.sandbox.secrets",
    "Secrets": "corral.sandbox.secrets",
    "Files": "corral.sandbox.sources",
    "GitSource": "corral.sandbox.sources",
    "LocalDir": "corral.sandbox.sources",
    "NoSource": "corral.sandbox.sources",
    "Parallel": "corral.sandbox.workspace",
    "Step": "corral.sandbox.workspace",
    "Workspace": "corral.sandbox.workspace",
    "parallel": "corral.sandbox.workspace",
}


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

__version__ = "0.1.0"

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
    "NoSource",
    "Parallel",
    "Policy",
    "PrerequisiteMissing",
    "Process",
    "Provider",
    "Redactor",
    "ResourceLimits",
    "RunContext",
    "Sandbox",
    "SandboxRef",
    "SandboxSpec",
    "SecretRef",
    "Secrets",
    "Step",
    "UnsupportedCapability",
    "Workspace",
    "__version__",
    "dump_config",
    "load_config",
    "parallel",
]
