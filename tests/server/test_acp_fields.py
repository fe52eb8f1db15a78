"""``agent`` in ``POST /v1/runs`` and ``forwardedProps.corral``: the ACP agent of the acp
harness, refused with any other harness."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from corral.server._models import StartRun


def test_agent_goes_with_the_acp_harness_only() -> None:
    body = StartRun.model_validate({"thread_id": "t", "prompt": "hi", "harness": "acp",
                                    "agent": "opencode"})
    assert body.agent == "opencode"
    with pytest.raises(ValidationError, match="ACP agent"):
        StartRun.model_validate({"thread_id": "t", "prompt": "hi", "harness": "claude-code",
                                 "agent": "opencode"})
    with pytest.raises(ValidationError):
        StartRun.model_validate({"thread_id": "t", "prompt": "hi", "harness": "acp",
                                 "agent": "../evil"})
