"""Sandbox providers. ``get_provider(name)`` builds one by name."""

from __future__ import annotations

from typing import Any

from corral._errors import ConfigError
from corral.sandbox._contracts import Provider

PROVIDER_NAMES = ("local", "bubblewrap")


def get_provider(name: str, **config: Any) -> Provider:
    """Build a provider by name (``local`` or ``bubblewrap``) with its configuration."""
    if name == "local":
        from corral.providers._local import LocalProvider

        return LocalProvider(**config)
    if name == "bubblewrap":
        from corral.providers._bubblewrap import BubblewrapProvider

        return BubblewrapProvider(**config)
    raise ConfigError(
        f"unknown provider {name!r}: choose one of {', '.join(PROVIDER_NAMES)}"
    )
