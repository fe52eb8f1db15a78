"""Sandbox providers, found by name in the provider registry.

``get_provider(name, **config)`` builds one; ``register_provider(name, factory)`` adds one in
this process, and a package adds one for every process through the entry-point group
``corral.providers`` (see :mod:`corral.sandbox._registry`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from corral._lazy import lazy_exports
from corral.sandbox._contracts import Provider
from corral.sandbox._registry import build_provider

if TYPE_CHECKING:
    from corral.sandbox._registry import (
        ProviderConfig,
        provider_names,
        register_provider,
        unregister_provider,
    )

# Names resolve on first use (corral._lazy), named for this namespace.
_EXPORTS: dict[str, str] = {
    name: "corral.sandbox._registry"
    for name in ("ProviderConfig", "provider_names", "register_provider", "unregister_provider")
}
__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

__all__ = [
    "PROVIDER_NAMES",
    "ProviderConfig",
    "get_provider",
    "provider_names",
    "register_provider",
    "unregister_provider",
]

PROVIDER_NAMES = ("local", "bubblewrap", "docker")
"""corral's own providers (every registered one: :func:`provider_names`)."""


def get_provider(name: str, **config: Any) -> Provider:
    """Build the provider registered as ``name`` with its configuration (validated against
    the provider's config model: an unknown key is a one-line ConfigError)."""
    return build_provider(name, config)
