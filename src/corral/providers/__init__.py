"""Sandbox providers, found by name in the provider registry.

``get_provider(name, **config)`` builds one; ``register_provider(name, factory)`` adds one in
this process, and a package adds one for every process through the entry-point group
``corral.providers`` (see :mod:`corral.sandbox._provider_registry`).
"""

from __future__ import annotations

from corral._lazy import TYPE_CHECKING, lazy_namespace

# The public names, listed once: resolved on first use (corral._lazy)
if TYPE_CHECKING or not lazy_namespace(globals()):
    from corral.providers._by_name import (
        PROVIDER_NAMES as PROVIDER_NAMES,
        get_provider as get_provider,
    )
    from corral.sandbox._provider_registry import (
        ProviderConfig as ProviderConfig,
        provider_names as provider_names,
        register_provider as register_provider,
        unregister_provider as unregister_provider,
    )
