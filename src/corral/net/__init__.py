"""The host-side proxies: the model proxy (the only place a model API key lives) and the
egress proxy (a sandbox's only way out, limited to an allowlist)."""

from __future__ import annotations

from corral._lazy import TYPE_CHECKING, lazy_namespace

# The public names, listed once: resolved on first use (corral._lazy)
if TYPE_CHECKING or not lazy_namespace(globals()):
    from corral.net._egress import EgressProxy as EgressProxy
    from corral.net._model_proxy import (
        ModelProxy as ModelProxy,
        Upstream as Upstream,
        Usage as Usage,
        UsageMeter as UsageMeter,
    )
