"""``GET /v1/harnesses``: the harnesses this server starts runs with, which of them lack
something on this machine (read on each call), its default and the one it suggests."""

from __future__ import annotations

import anyio.to_thread
from fastapi import APIRouter

from corral.harness._registry import harness_names
from corral.server._http_errors import responses
from corral.server._models import HarnessList, HarnessUnavailable
from corral.server._routing import Service

__all__ = ["router"]

router = APIRouter()


@router.get("/v1/harnesses", response_model=HarnessList, responses=responses(401),
            summary="The harnesses this server starts runs with (and its default)")
async def harnesses(service: Service) -> HarnessList:
    config = service.config
    allowed = config.allowed_harnesses
    names = list(allowed) if allowed is not None else harness_names()
    # what is missing (agent installs, model keys) is read on each call: an operator's
    # `corral agents install` shows without a restart
    from corral.agents._prepare import harness_unavailable  # start-up cost: when used

    missing = await anyio.to_thread.run_sync(
        lambda: {n: harness_unavailable(n) for n in names})
    ready = [n for n in names if missing[n] is None]
    unavailable = [HarnessUnavailable(name=n, code=exc.code, reason=str(exc))
                   for n, exc in missing.items() if exc is not None]
    agents = [n for n in ready if n != "command"]
    preferred = [config.default_harness, "claude-code", *agents, "command"]
    suggested = next((n for n in preferred if n is not None and n in ready), None)
    return HarnessList(harnesses=ready, default_harness=config.default_harness,
                       unavailable=unavailable, suggested_harness=suggested)
