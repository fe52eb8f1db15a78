"""Harnesses by name. A run's record keeps the harness name and its spec, so any host can
rebuild the same harness (and so the same translator) to continue the run."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from corral._errors import ConfigError
from corral.harness._base import Harness
from corral.harness._command import CommandHarness

if TYPE_CHECKING:
    from corral.stores._records import RunRecord

HarnessFactory = Callable[[Mapping[str, Any]], Harness]


def _command(spec: Mapping[str, Any]) -> Harness:
    argv = spec.get("argv")
    if not isinstance(argv, list | tuple) or not argv or not all(isinstance(a, str) for a in argv):
        raise ConfigError("the command harness needs a command: a non-empty list of strings")
    return CommandHarness(list(argv))


def _claude_code(spec: Mapping[str, Any]) -> Harness:
    # Imported here: the agent-CLI modules pull in the journal and net code, which import
    # parts of corral.runs (which imports this registry).
    from corral.harness._claude_code import ClaudeCodeHarness

    return ClaudeCodeHarness.from_spec(spec)


def _codex(spec: Mapping[str, Any]) -> Harness:
    from corral.harness._codex import CodexHarness

    return CodexHarness.from_spec(spec)


_FACTORIES: dict[str, HarnessFactory] = {
    "command": _command,
    "claude-code": _claude_code,
    "codex": _codex,
}


def register_harness(name: str, factory: HarnessFactory) -> None:
    """Make ``name`` available to runs (``factory`` builds the harness from the run spec)."""
    _FACTORIES[name] = factory


def harness_names() -> list[str]:
    """The registered harness names, sorted."""
    return sorted(_FACTORIES)


def build_harness(name: str, spec: Mapping[str, Any]) -> Harness:
    """The harness called ``name`` configured from a run's ``spec``."""
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ConfigError(
            f"unknown harness {name!r}: choose one of {', '.join(harness_names())}"
        )
    return factory(spec)


def harness_for_record(record: RunRecord) -> Harness:
    """The harness a run was started with, rebuilt from its record."""
    return build_harness(record.harness or "command", record.spec or {})
