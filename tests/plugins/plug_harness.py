"""A test-only package's harness, registered through the ``corral.harnesses`` entry point.

``plug-sh`` runs the run's prompt as a shell script (``sh -c PROMPT``) and translates its
output as the command harness does. Its typed configuration refuses unknown keys and
requires ``model`` (the harness option ``corral run --model`` passes), which it calls the
run's *tag*: with the agent's exit the translator logs a ``CUSTOM plug.exit`` event
carrying it, so a test sees which configuration the process that translated the exit
rebuilt the harness with.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import ConfigDict

from corral.harness import AgentCommand, AgentRequest, HarnessConfig, RunContext
from corral.harness._command import CommandTranslator
from corral.journal._reader import Exit, JournalItem

if TYPE_CHECKING:
    from ag_ui.core import BaseEvent

DIST = "corral-plug-harness"
VERSION = "0.3"
ENTRY_POINT = "plug-sh = plug_harness:PlugShHarness"


class PlugShConfig(HarnessConfig):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str


class PlugTranslator:
    def __init__(self, ctx: RunContext, tag: str) -> None:
        self.inner = CommandTranslator(ctx)
        self.tag = tag

    def start(self) -> list[BaseEvent]:
        return self.inner.start()

    def feed(self, item: JournalItem) -> list[BaseEvent]:
        events = self.inner.feed(item)
        if isinstance(item, Exit) and events:
            from ag_ui.core import CustomEvent

            events.insert(-1, CustomEvent(name="plug.exit", value={"tag": self.tag}))
        return events


class PlugShHarness:
    name = "plug-sh"
    resume: Literal["offset", "replay"] = "offset"
    config_model: ClassVar[type[HarnessConfig]] = PlugShConfig

    def __init__(self, model: str) -> None:
        self.tag = model

    def build_command(self, request: AgentRequest) -> AgentCommand:
        return AgentCommand(argv=["sh", "-c", request.prompt or "true"], env=dict(request.env),
                            cwd=request.workdir)

    def translator(self, ctx: RunContext, *, at_offset: int | None = None) -> PlugTranslator:
        return PlugTranslator(ctx, self.tag)


def install(target: Path) -> Path:
    """Make ``target`` an importable "installed" copy of this package (the module plus a
    ``.dist-info`` with its entry point): put it on PYTHONPATH."""
    target.mkdir(parents=True, exist_ok=True)
    (target / "plug_harness.py").write_text(Path(__file__).read_text())
    info = target / f"corral_plug_harness-{VERSION}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST}\nVersion: {VERSION}\n")
    (info / "entry_points.txt").write_text(f"[corral.harnesses]\n{ENTRY_POINT}\n")
    return target
