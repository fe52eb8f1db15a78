"""Harnesses: how to launch each agent CLI and translate its output to AG-UI events.

Adapters (:class:`CommandHarness`, :class:`ClaudeCodeHarness`, :class:`CodexHarness`,
:class:`GeminiCliHarness`) are
pure: argv, env, session paths, policy projection, and a translator from journal lines to
events. Harnesses are found by name (:mod:`corral.harness._registry`): corral's own and
those installed packages declare in the entry-point group ``corral.harnesses``, or
:func:`register_harness` in this process; each has a typed configuration
(:class:`HarnessConfig`); :func:`build_harness` builds one. What a harness implements
(``Harness``, ``Translator``) is in :mod:`corral.abc`.
"""

from __future__ import annotations

from corral._lazy import TYPE_CHECKING, lazy_namespace

# Protocols live in corral.abc only: their old names here resolve with a warning
_MOVED = dict.fromkeys(("Harness", "Translator"), "corral.abc")

# The public names, listed once: resolved on first use (corral._lazy)
if TYPE_CHECKING or not lazy_namespace(globals(), moved=_MOVED):
    from corral.harness._base import (
        AgentCommand as AgentCommand,
        AgentRequest as AgentRequest,
        Batch as Batch,
        RunContext as RunContext,
        translate_run as translate_run,
    )
    from corral.harness._claude_code import ClaudeCodeHarness as ClaudeCodeHarness
    from corral.harness._codex import CodexHarness as CodexHarness
    from corral.harness._opencode import OpencodeHarness as OpencodeHarness
    from corral.harness._command import CommandHarness as CommandHarness
    from corral.harness._gemini_cli import GeminiCliHarness as GeminiCliHarness
    from corral.harness._events import (
        EventParseError as EventParseError,
        event_from_dict as event_from_dict,
        event_from_json as event_from_json,
        event_to_dict as event_to_dict,
        event_to_json as event_to_json,
        is_terminal as is_terminal,
    )
    from corral.harness._registry import (
        build_harness as build_harness,
        harness_names as harness_names,
        register_harness as register_harness,
        unregister_harness as unregister_harness,
    )
    from corral.harness._config import HarnessConfig as HarnessConfig
