"""Harness conformance kit: what every agent harness (``--harness NAME``) must do, as
plain checks run against the real CLI in a real sandbox.

    from corral.testing import HarnessCase, check_harness

    await check_harness(lambda: HarnessCase("gemini-cli", {"model": "gemini-fake"},
                                            enforces=frozenset()))

An ACP agent plugs in the same way, e.g. ``HarnessCase("acp", {"agent": "gemini", "model":
"gemini-fake"}, enforces=frozenset({...}))`` (``run_args`` default to ``--agent gemini
--model gemini-fake``); see ``tests/agents/test_harness_kit.py`` for the four CLIs' cases.

How a harness plugs in: give a factory of a :class:`HarnessCase` naming the harness as
``corral run --harness`` knows it (registered in :mod:`corral.harness._registry`), the
options a :class:`~corral.runs._request.RunRequest` takes for it (``model``, ``agent`` …),
which command-policy :data:`FEATURES` it enforces (the rest must be refused at definition
time), and, where its CLI differs, how the scripted model answers its side requests
(``side_reply``) and calls host tools (``host_tool_call``). The CLI must be installed
(``corral agents install``; ``agents_dir`` or ``$CORRAL_AGENTS_DIR``) and bubblewrap must
work. Each check runs in a fresh :class:`~corral.testing._harness_world.HarnessWorld`: a
scripted model server on 127.0.0.1 speaking the CLI's own wire format is every model
upstream (``ANTHROPIC_BASE_URL``, ``OPENAI_BASE_URL``, ``GOOGLE_GEMINI_BASE_URL`` with a
per-world key), with a private ``$CORRAL_HOME``; the kit sets these in ``os.environ``
while a check runs (a Runner in this process reads them), so run checks one at a time.

What the harness must give for the checks to hold: AG-UI events where every tool call has
a start, an end and one result; the model's shell tool is one
:class:`~corral.testing._model_script.ToolCall` finds (``req.shell_tool``); a
``corral.session`` CUSTOM event carrying ``sessionId`` per run (the thread's CLI
session); host tools offered under a name ending with the tool's own name; and a
journal a successor can translate afresh to the same events (``corral attach``).

:data:`HARNESS_KIT` lists the checks; :func:`check_harness` runs them all and raises
:class:`~corral.testing.KitFailed`; ``pytest_checks(HARNESS_KIT, {...}, globals())`` makes
one pytest test per check and harness.
"""


from __future__ import annotations

from collections.abc import Iterable

from corral.testing._harness_commands import COMMAND_CHECKS
from corral.testing._harness_host_tools import HOST_TOOL_CHECKS
from corral.testing._harness_sessions import SESSION_CHECKS
from corral.testing._harness_stops import STOP_CHECKS
from corral.testing._harness_world import HarnessWorld, world
from corral.testing._kit import Factory, Kit, KitReport

__all__ = ["HARNESS_KIT", "check_harness"]

HARNESS_KIT: Kit[HarnessWorld] = Kit("harness", (
    *COMMAND_CHECKS.checks, *HOST_TOOL_CHECKS.checks, *SESSION_CHECKS.checks, *STOP_CHECKS.checks,
), subject=world)
"""Every harness check, one part (``_harness_commands``, ``_harness_host_tools``,
``_harness_sessions``, ``_harness_stops``) after another; the subject is a
:class:`HarnessWorld` around the factory's :class:`HarnessCase`."""


async def check_harness(make_case: Factory, *, only: Iterable[str] | None = None
                        ) -> KitReport:
    """Run the harness kit (a fresh world per check) for the :class:`HarnessCase` that
    ``make_case`` makes; raise :class:`~corral.testing.KitFailed` naming every failed
    check, else return the report."""
    return await HARNESS_KIT.verify(make_case, only=only)
