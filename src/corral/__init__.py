"""corral: run coding-agent CLIs in isolated sandboxes, stream AG-UI events, keep runs durable."""

from __future__ import annotations

from corral.errors import ConfigError, CorralError, PrerequisiteMissing
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

__version__ = "0.1.0"

__all__ = [
    "Capabilities",
    "ConfigError",
    "CorralError",
    "ExecResult",
    "Handle",
    "PrerequisiteMissing",
    "Process",
    "Provider",
    "ResourceLimits",
    "SandboxRef",
    "SandboxSpec",
    "UnsupportedCapability",
    "__version__",
]
