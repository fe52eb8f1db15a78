"""A provider by its registered name: :func:`get_provider`, and corral's own names."""

from __future__ import annotations

from typing import Any

from corral.sandbox._contracts import Provider
from corral.sandbox._provider_registry import build_provider

PROVIDER_NAMES = ("local", "bubblewrap", "docker")
"""corral's own providers (every registered one: :func:`provider_names`)."""


def get_provider(name: str, **config: Any) -> Provider:
    """Build the provider registered as ``name`` with its configuration (validated against
    the provider's config model: an unknown key is a one-line ConfigError)."""
    return build_provider(name, config)
