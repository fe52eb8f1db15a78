"""Checking a run request before anything is recorded: the :class:`StartPlan` that
:meth:`corral.runs.Runner.start` records and launches (the definition, the run spec, the
harness, the provider and where the agent will live)."""

from __future__ import annotations

from dataclasses import dataclass

from corral._errors import ConfigError
from corral.agents._prepare import agent_prerequisites
from corral.harness._base import AgentCommand, AgentRequest, Harness
from corral.harness._cli_base import CliHarness
from corral.runs._placement import placement
from corral.runs._request import RunRequest
from corral.runs._site import AgentSite
from corral.runs._spec import RunSpec
from corral.sandbox._contracts import Provider
from corral.sandbox._definition import Sandbox
from corral.sandbox._ensure import Ensured
from corral.tools._core import Toolset

__all__ = ["StartPlan", "plan_start"]


@dataclass(slots=True)
class StartPlan:
    """A checked request: what :meth:`corral.runs.Runner.start` records and launches."""

    request: RunRequest
    sandbox: Sandbox
    spec: RunSpec
    harness: Harness
    agent_request: AgentRequest
    provider: Provider
    placement: type[AgentSite]
    """Where the run's agent will live (:mod:`corral.runs._placement`)."""
    tools: Toolset | None
    """The host tools the run's drivers serve (agent CLIs only; ``None``: no tool server)."""
    command: AgentCommand | None
    """The command harness's agent command (``None`` for an agent CLI)."""
    ensured: Ensured | None = None
    """The run's sandbox, once made."""
    site: AgentSite | None = None
    """The run's agent site, once its sandbox is made."""


def plan_start(request: RunRequest, default_tools: Toolset | None) -> StartPlan:
    """Check ``request`` before anything is recorded (a missing CLI or key, a prompt-less
    agent run, a provider that cannot host a supervised agent are the user's to fix):
    raises :class:`ConfigError`. Each lower package is asked once, in the layers' order:
    the harness, the sandbox's provider, the agent CLI's prerequisites."""
    sandbox = request.definition()
    chosen = request.harness_choice(sandbox)
    spec = RunSpec.of_request(request, sandbox, chosen)
    harness = chosen.harness
    agent_request = AgentRequest(
        prompt=request.prompt, env=dict(request.env), options=request.options
    )
    tools = request.tools if request.tools is not None else default_tools
    # where the agent runs first: what it cannot host is the clearest error
    provider = sandbox.get_provider()
    site = placement(provider.capabilities)
    if site is None:
        raise ConfigError(f"provider {provider.name!r} cannot host a supervised agent yet; "
                          "use --provider bubblewrap or local")
    if provider.host_route == "none" and isinstance(harness, CliHarness):
        raise ConfigError(
            f"agent runs need corral's host services (model proxy, host tools), which cannot "
            f"reach the {provider.name} provider's sandboxes from this host (e.g. a remote "
            f"Docker daemon); command runs work (corral run --provider {provider.name} -- CMD)")
    if isinstance(harness, CliHarness) and harness.bridged and not site.HOST_BRIDGE:
        what = "--harness acp" if harness.name == "acp" else (
            f"--harness {harness.name} with this policy (its ask rules are answered through "
            f"the agent's ACP mode)")
        raise ConfigError(
            f"{what} needs corral's ACP bridge on the host next to the supervisor, and the "
            f"{provider.name} provider runs the supervisor in the sandbox; use --provider "
            "bubblewrap or local" + ("" if harness.name == "acp" else
                                     ", or allow/deny rules only"))
    command = None
    if request.tools is not None and not isinstance(harness, CliHarness):
        raise ConfigError("host tools need an agent-CLI harness (claude-code, codex, "
                          f"gemini-cli, opencode); the {harness.name} harness cannot call them")
    if isinstance(harness, CliHarness):
        agent_prerequisites(harness)
        if not (request.prompt or "").strip():
            raise ConfigError(f"the {harness.name} harness needs a non-empty prompt")
        if tools is None and (harness.policy_mapping.permission_prompt
                              or spec.frontend_tools
                              or (spec.output_schema is not None
                                  and not harness.native_output)):
            # the server is needed for the permission prompt, a client's tools or the
            # submit_result tool alone
            tools = Toolset()
    else:
        command = harness.build_command(agent_request)
        tools = None
    return StartPlan(request, sandbox, spec, harness, agent_request, provider, site, tools,
                     command)
