"""The harness of a run about to start, chosen in one step (:func:`choose_harness`): what
the run records of it (the policy it enforces, whether it asks corral before acting, the
package that provides it) and the harness built from that. :func:`run_config` is the
mapping a run's harness is built from, here at the start and from the record by every
later process (:meth:`corral.runs._spec.RunSpec.harness_config`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from corral.harness._base import Harness
from corral.harness._registry import build_registered

if TYPE_CHECKING:
    from corral.policy._policy import Policy

__all__ = ["ASKS_CORRAL", "HarnessChoice", "choose_harness", "run_config"]

ASKS_CORRAL = frozenset({"claude-code", "codex", "gemini-cli", "acp"})
"""The harnesses whose CLI asks corral (permission prompt tool, command gate hook, on the
run's MCP server) under any written policy: it is evaluated live (ask rules become corral
approvals). opencode asks only for what ``opencode run`` cannot enforce."""


@dataclass(frozen=True, slots=True)
class HarnessChoice:
    """A run's harness and what the run records of it."""

    harness: Harness
    policy: dict[str, Any] | None
    """The policy the agent CLI enforces (``RunSpec.policy``)."""
    permission_prompt: bool
    """The agent CLI asks corral before acting (``RunSpec.permission_prompt``)."""
    package: dict[str, Any]
    """The package that provides it (``RunSpec.harness_package``)."""


def run_config(options: Mapping[str, Any], *, argv: Sequence[str] | None = None,
               policy: Mapping[str, Any] | None = None, permission_prompt: bool = False,
               output_schema: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The mapping a run's harness is built from (``build_harness(name, config)``): its
    options, plus what the run decided for it (command, policy, permission prompt), which
    wins over an option of the same name."""
    out = dict(options)
    if argv is not None:
        out["argv"] = list(argv)
    if policy is not None:
        out["policy"] = dict(policy)
    if permission_prompt:
        out["permission_prompt"] = True
    if output_schema is not None:
        out["output_schema"] = dict(output_schema)
    return out


def choose_harness(name: str, options: Mapping[str, Any], *, argv: Sequence[str] | None,
                   policy: Policy | None, output_schema: Mapping[str, Any] | None
                   ) -> HarnessChoice:
    """The harness called ``name`` for a run with these ``options`` (and ``argv``, the
    command of a ``command`` run), the ``policy`` the user wrote (``None``: the default
    one, which the agent CLIs cannot enforce: they run with their permission prompts off,
    confined by the sandbox) and ``output_schema``. Raises :class:`ConfigError` for a
    harness nothing provides or a bad option."""
    written = policy if name != "command" else None
    recorded = written.to_dict() if written is not None else None
    config = run_config(options, argv=argv, policy=recorded, output_schema=output_schema)
    prompt = False
    if written is not None:
        prompt = name in ASKS_CORRAL
        if name == "opencode":
            # ask rules route opencode through `opencode acp`, which asks corral
            from corral.harness._opencode import acp_reasons

            prompt = bool(acp_reasons(written))
    if prompt:
        config["permission_prompt"] = True
    reg, harness = build_registered(name, config)
    return HarnessChoice(harness, recorded, prompt, reg.recorded())
