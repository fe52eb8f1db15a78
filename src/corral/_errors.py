"""Exception roots. Every error corral raises for a user mistake derives from CorralError."""

from __future__ import annotations


class CorralError(Exception):
    """Base class of corral's errors. ``str(err)`` is a complete, user-facing sentence."""


class ConfigError(CorralError, ValueError):
    """A definition, option or file is invalid. The message names the field and the fix."""


class PrerequisiteMissing(CorralError):
    """Something the machine needs is absent (bwrap, git, …). The message names the fix."""
