"""Exception roots. Every error corral raises for a user mistake derives from CorralError."""

from __future__ import annotations


class CorralError(Exception):
    """Base class of corral's errors. ``str(err)`` is a complete, user-facing sentence."""


class ConfigError(CorralError, ValueError):
    """A definition, option or file is invalid. The message names the field and the fix."""


class PrerequisiteMissing(CorralError):
    """Something the machine needs is absent (bwrap, git, …). The message names the fix.

    ``code`` is the error code the HTTP API answers it with (503: the server cannot do this
    until its operator fixes the machine)."""

    code: str = "prerequisite_missing"


class AgentNotInstalled(PrerequisiteMissing):
    """The agent CLI a harness runs is not installed (``corral agents install NAME``)."""

    code = "harness_not_installed"


class ModelKeyMissing(PrerequisiteMissing):
    """The host variable holding the model API's key is not set."""

    code = "model_key_missing"
