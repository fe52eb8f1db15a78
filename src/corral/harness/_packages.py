"""The agent CLIs corral knows: npm package, pinned version, executable, and where installs
appear inside sandboxes. Data only; installing them is :mod:`corral.agents`' job."""

from __future__ import annotations

from dataclasses import dataclass

from corral._errors import ConfigError

__all__ = ["AGENTS_MOUNT", "KNOWN_AGENTS", "AgentPackage", "Companion", "package_for"]

AGENTS_MOUNT = "/opt/corral/agents"
"""Where the agents root appears inside isolated sandboxes (read-only)."""

@dataclass(frozen=True, slots=True)
class Companion:
    """A second npm package installed beside an agent CLI, in its own npm prefix
    ``<install>/<subdir>`` (the Claude Code ACP adapter beside Claude Code)."""

    subdir: str
    package: str
    version: str
    bin: str
    omit_optional: bool = False
    """``npm install --omit=optional``: skip optional dependencies (the adapter's SDK
    brings its own 330 MB copy of the Claude CLI as one; corral points it at the install's
    CLI instead)."""

    @property
    def rel_bin(self) -> str:
        """The executable relative to the install directory."""
        return f"{self.subdir}/node_modules/.bin/{self.bin}"


@dataclass(frozen=True, slots=True)
class AgentPackage:
    """An agent CLI corral knows how to install."""

    name: str
    package: str
    """The npm package."""
    version: str
    """The pinned, tested version (installed unless another is asked for)."""
    bin: str
    """The executable under ``node_modules/.bin``."""
    supported: bool = True
    """Whether corral has a harness for it yet."""
    companions: tuple[Companion, ...] = ()
    """Packages installed beside it (see :class:`Companion`)."""


CLAUDE_ACP = Companion("acp", "@agentclientprotocol/claude-agent-acp", "0.101.0",
                       "claude-agent-acp", omit_optional=True)
"""The Claude Code ACP adapter (``--harness acp --agent claude``), beside Claude Code."""

KNOWN_AGENTS: dict[str, AgentPackage] = {
    p.name: p
    for p in (
        AgentPackage("claude-code", "@anthropic-ai/claude-code", "2.1.332", "claude",
                     companions=(CLAUDE_ACP,)),
        AgentPackage("codex", "@openai/codex", "0.171.0", "codex"),
        AgentPackage("opencode", "opencode-ai", "1.18.33", "opencode"),
        AgentPackage("gemini-cli", "@google/gemini-cli", "0.61.0", "gemini"),
    )
}


def package_for(name: str, *, require_supported: bool = True) -> AgentPackage:
    """The package for an agent name; raises :class:`ConfigError` for unknown or not yet
    supported names."""
    pkg = KNOWN_AGENTS.get(name)
    if pkg is None:
        raise ConfigError(
            f"unknown agent {name!r}: choose one of {', '.join(sorted(KNOWN_AGENTS))}"
        )
    if require_supported and not pkg.supported:
        raise ConfigError(
            f"agent {name!r} is not yet supported by corral (its harness is not built); "
            "supported now: " + ", ".join(n for n, p in KNOWN_AGENTS.items() if p.supported)
        )
    return pkg
