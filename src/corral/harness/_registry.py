"""Harnesses by name. A run's record keeps the harness name and its options (in the run
spec, :mod:`corral.runs._spec`), so any host can rebuild the same harness (and so the same
translator) to continue the run. This module knows nothing of run records."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from corral._errors import ConfigError
from corral.harness._base import Harness
from corral.harness._command import CommandHarness

HarnessFactory = Callable[[Mapping[str, Any]], Harness]
"""Builds a harness from its configuration (its options, plus ``argv``, ``policy`` and
``permission_prompt`` as the run decided them)."""


def _command(config: Mapping[str, Any]) -> Harness:
    argv = config.get("argv")
    if not isinstance(argv, list | tuple) or not argv or not all(isinstance(a, str) for a in argv):
        raise ConfigError("the command harness needs a command: a non-empty list of strings")
    return CommandHarness(list(argv))


# The agent-CLI adapters are imported when one is built, for start-up cost: they load the
# agent-CLI stack (policy projection, model proxy, httpx), which a driver taking over a
# ``command`` run (``corral attach``) never needs.
def _claude_code(config: Mapping[str, Any]) -> Harness:
    from corral.harness._claude_code import ClaudeCodeHarness

    return ClaudeCodeHarness.from_spec(config)


def _codex(config: Mapping[str, Any]) -> Harness:
    from corral.harness._codex import CodexHarness

    return CodexHarness.from_spec(config)


def _gemini_cli(config: Mapping[str, Any]) -> Harness:
    from corral.harness._gemini_cli import GeminiCliHarness

    return GeminiCliHarness.from_spec(config)


def _opencode(config: Mapping[str, Any]) -> Harness:
    from corral.harness._opencode import OpencodeHarness

    return OpencodeHarness.from_spec(config)


def _acp(config: Mapping[str, Any]) -> Harness:
    from corral.harness._acp import AcpHarness

    return AcpHarness.from_spec(config)


_FACTORIES: dict[str, HarnessFactory] = {
    "command": _command,
    "acp": _acp,
    "claude-code": _claude_code,
    "codex": _codex,
    "gemini-cli": _gemini_cli,
    "opencode": _opencode,
}


def register_harness(name: str, factory: HarnessFactory) -> None:
    """Make ``name`` available to runs (``factory`` builds the harness from its config)."""
    _FACTORIES[name] = factory


def harness_names() -> list[str]:
    """The registered harness names, sorted."""
    return sorted(_FACTORIES)


def build_harness(name: str, config: Mapping[str, Any]) -> Harness:
    """The harness called ``name`` built from ``config`` (see :data:`HarnessFactory`)."""
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ConfigError(
            f"unknown harness {name!r}: choose one of {', '.join(harness_names())}"
        )
    harness = factory(config)
    schema = config.get("output_schema")
    if schema is not None:
        use = getattr(harness, "use_output_schema", None)
        if use is None:
            raise ConfigError(
                f"the {name} harness cannot return a structured result (output_schema): "
                "use an agent CLI harness (claude-code, codex, opencode, gemini-cli, acp)")
        use(schema)
    return harness
