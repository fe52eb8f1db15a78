"""The agent runtime: installing agent CLIs, preparing and finishing them in a sandbox,
their sessions per thread, and the host services (model and egress proxies) of a run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral._lazy import lazy_exports

if TYPE_CHECKING:
    from corral.agents._installs import InstallError, InstalledAgent, install_agent, list_installed
    from corral.agents._prepare import (
        FinishReport,
        PreparedAgent,
        finish_agent_run,
        prepare_agent,
        with_agent_binds,
    )
    from corral.agents._services import ServicesStartError
    from corral.agents._sessions import SessionSaveError, load_session

# Names resolve on first use (corral._lazy).
_EXPORTS: dict[str, str] = {
    "InstallError": "corral.agents._installs",
    "InstalledAgent": "corral.agents._installs",
    "install_agent": "corral.agents._installs",
    "list_installed": "corral.agents._installs",
    "FinishReport": "corral.agents._prepare",
    "PreparedAgent": "corral.agents._prepare",
    "finish_agent_run": "corral.agents._prepare",
    "prepare_agent": "corral.agents._prepare",
    "with_agent_binds": "corral.agents._prepare",
    "ServicesStartError": "corral.agents._services",
    "SessionSaveError": "corral.agents._sessions",
    "load_session": "corral.agents._sessions",
}

__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

__all__ = [
    "FinishReport",
    "InstallError",
    "InstalledAgent",
    "PreparedAgent",
    "ServicesStartError",
    "SessionSaveError",
    "finish_agent_run",
    "install_agent",
    "list_installed",
    "load_session",
    "prepare_agent",
    "with_agent_binds",
]
