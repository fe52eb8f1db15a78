"""The host-side proxies: the model proxy (the only place a model API key lives) and the
egress proxy (a sandbox's only way out, limited to an allowlist)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral._lazy import lazy_exports

if TYPE_CHECKING:
    from corral.net._egress import EgressProxy
    from corral.net._model_proxy import ModelProxy, Upstream, Usage, UsageMeter

# Names resolve on first use (corral._lazy).
_EXPORTS: dict[str, str] = {
    "EgressProxy": "corral.net._egress",
    "ModelProxy": "corral.net._model_proxy",
    "Upstream": "corral.net._model_proxy",
    "Usage": "corral.net._model_proxy",
    "UsageMeter": "corral.net._model_proxy",
}

__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

__all__ = [
    "EgressProxy",
    "ModelProxy",
    "Upstream",
    "Usage",
    "UsageMeter",
]
