"""A spec's resource limits over a provider's defaults (shared by the providers)."""

from __future__ import annotations

from corral._errors import ConfigError
from corral.sandbox._contracts import ResourceLimits

__all__ = ["merged_limits"]


def merged_limits(defaults: ResourceLimits, requested: ResourceLimits) -> ResourceLimits:
    """``requested``'s limits, ``defaults`` for the fields it leaves ``None``; raise
    :class:`ConfigError` for memory, pids or cpus below what a sandbox can start with (the
    disk limit is the caller's: only some providers enforce it)."""
    d, s = defaults, requested
    lim = ResourceLimits(
        memory_bytes=s.memory_bytes if s.memory_bytes is not None else d.memory_bytes,
        pids=s.pids if s.pids is not None else d.pids,
        cpus=s.cpus if s.cpus is not None else d.cpus,
        disk_bytes=s.disk_bytes if s.disk_bytes is not None else d.disk_bytes,
    )
    if lim.memory_bytes is not None and lim.memory_bytes < (8 << 20):
        raise ConfigError("memory limit must be at least 8 MiB")
    if lim.pids is not None and lim.pids < 8:
        raise ConfigError("pids limit must be at least 8")
    if lim.cpus is not None and lim.cpus <= 0:
        raise ConfigError("cpus limit must be positive")
    return lim
