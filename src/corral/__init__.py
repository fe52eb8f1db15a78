"""corral: run coding-agent CLIs in isolated sandboxes, stream AG-UI events, keep runs durable."""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral._lazy import lazy_exports

if TYPE_CHECKING:
    from corral._errors import ConfigError, CorralError, PrerequisiteMissing
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

# Names resolve on first use (corral._lazy).
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
