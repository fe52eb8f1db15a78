"""Fixtures for the security tests: the agent-CLI fixtures of ``tests/agents`` (real CLIs
from npm, bubblewrap, the scripted model server) are shared here."""

from __future__ import annotations

from tests.agents.conftest import (  # noqa: F401 - fixtures, found by pytest by name
    agent_installs,
    agents_env,
    bwrap,
    model_server,
)
