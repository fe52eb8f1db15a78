"""corral: run coding-agent CLIs in isolated sandboxes, stream AG-UI events, keep runs durable."""

from __future__ import annotations

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
