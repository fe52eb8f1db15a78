"""The agent runtime: installing agent CLIs, preparing and finishing them in a sandbox,
their sessions per thread, and the host services (model and egress proxies) of a run."""

from __future__ import annotations

from corral._lazy import TYPE_CHECKING, lazy_namespace

# The public names, listed once: resolved on first use (corral._lazy)
if TYPE_CHECKING or not lazy_namespace(globals()):
    from corral.agents._installs import (
        InstallError as InstallError,
        InstalledAgent as InstalledAgent,
        install_agent as install_agent,
        list_installed as list_installed,
    )
    from corral.agents._prepare import (
        FinishReport as FinishReport,
        PreparedAgent as PreparedAgent,
        finish_agent_run as finish_agent_run,
        prepare_agent as prepare_agent,
        with_agent_binds as with_agent_binds,
    )
    from corral.agents._services import ServicesStartError as ServicesStartError
    from corral.agents._sessions import (
        SessionSaveError as SessionSaveError,
        load_session as load_session,
    )
