"""Harnesses: how to launch each agent CLI and translate its output to AG-UI events.

Adapters (:class:`CommandHarness`, :class:`ClaudeCodeHarness`, :class:`CodexHarness`,
:class:`GeminiCliHarness`) are
pure: argv, env, session paths, policy projection, and a translator from journal lines to
events. Harnesses are found by name (:mod:`corral.harness._registry`): corral's own and
those installed packages declare in the entry-point group ``corral.harnesses``, or
:func:`register_harness` in this process; each has a typed configuration
(:class:`HarnessConfig`); :func:`build_harness` builds one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral._lazy import lazy_exports

if TYPE_CHECKING:
    from corral.harness._base import (
        AgentCommand,
        AgentRequest,
        Batch,
        Harness,
        RunContext,
        Translator,
        translate_run,
    )
    from corral.harness._claude_code import ClaudeCodeHarness
    from corral.harness._codex import CodexHarness
    from corral.harness._opencode import OpencodeHarness
    from corral.harness._command import CommandHarness
    from corral.harness._gemini_cli import GeminiCliHarness
    from corral.harness._events import (
        EventParseError,
        event_from_dict,
        event_from_json,
        event_to_dict,
        event_to_json,
        is_terminal,
    )
    from corral.harness._config import HarnessConfig
    from corral.harness._registry import (
        build_harness,
        harness_names,
        register_harness,
        unregister_harness,
    )

# Names resolve on first use (corral._lazy).
_EXPORTS: dict[str, str] = {
    "AgentCommand": "corral.harness._base",
    "AgentRequest": "corral.harness._base",
    "Batch": "corral.harness._base",
    "Harness": "corral.harness._base",
    "RunContext": "corral.harness._base",
    "Translator": "corral.harness._base",
    "translate_run": "corral.harness._base",
    "ClaudeCodeHarness": "corral.harness._claude_code",
    "CodexHarness": "corral.harness._codex",
    "OpencodeHarness": "corral.harness._opencode",
    "CommandHarness": "corral.harness._command",
    "GeminiCliHarness": "corral.harness._gemini_cli",
    "EventParseError": "corral.harness._events",
    "event_from_dict": "corral.harness._events",
    "event_from_json": "corral.harness._events",
    "event_to_dict": "corral.harness._events",
    "event_to_json": "corral.harness._events",
    "is_terminal": "corral.harness._events",
    "HarnessConfig": "corral.harness._config",
    "build_harness": "corral.harness._registry",
    "harness_names": "corral.harness._registry",
    "register_harness": "corral.harness._registry",
    "unregister_harness": "corral.harness._registry",
}

__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

__all__ = [
    "AgentCommand",
    "AgentRequest",
    "Batch",
    "ClaudeCodeHarness",
    "CodexHarness",
    "OpencodeHarness",
    "CommandHarness",
    "EventParseError",
    "GeminiCliHarness",
    "Harness",
    "HarnessConfig",
    "RunContext",
    "Translator",
    "build_harness",
    "event_from_dict",
    "event_from_json",
    "event_to_dict",
    "event_to_json",
    "harness_names",
    "is_terminal",
    "register_harness",
    "translate_run",
    "unregister_harness",
]
