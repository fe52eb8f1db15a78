"""The ``command`` harness: any program; its stdout becomes one assistant text message.

Events of a run: ``RUN_STARTED``, ``TEXT_MESSAGE_START`` (id ``<run_id>-m0``: the message
starts at journal offset 0), one or more ``TEXT_MESSAGE_CONTENT`` per stdout line, then
``TEXT_MESSAGE_END`` and ``RUN_FINISHED`` (exit 0) or ``RUN_ERROR`` (non-zero exit or signal;
the message names the exit code or signal and ends with the tail of stderr; ``code`` is
``"exit:<N>"`` or ``"signal:<NAME>"``; ``metadata`` holds ``exitCode`` and ``signal``).

Text rule: the journal line starting at offset ``s`` contributes ``"\\n" + text`` when
``s > 0`` and ``text`` when ``s == 0`` (see :mod:`corral.journal._reader`), split into deltas of
at most ``max_delta_chars`` characters, and empty contributions are skipped. So the deltas of
a run, concatenated, are exactly the program's stdout whenever it is valid UTF-8, and each
line's visible text is delivered as soon as the line is complete.

Invalid UTF-8: such a line's delta uses U+FFFD for the bad bytes, and, just before it, a
``CUSTOM`` event named ``corral.stdout.bytes`` carries ``{"offset": s, "chars": n, "base64":
<the line's raw bytes>}``, ``n`` being the number of delta characters that follow and stand
for that line (its ``\\n`` prefix included). Rebuilding stdout byte for byte: for such an
event, emit ``\\n`` (if ``s > 0``) plus the raw bytes and skip the next ``n`` delta
characters; encode every other delta as UTF-8. Translation never fails on agent output.

The translator's state is a function of the journal offset alone (``resume = "offset"``).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from corral._errors import ConfigError
from corral.harness._base import AgentCommand, AgentRequest, Harness, RunContext
from corral.journal._reader import Exit, JournalItem, Line
from corral.sandbox._contracts import signal_name

if TYPE_CHECKING:
    from ag_ui.core import BaseEvent

__all__ = ["RAW_BYTES_EVENT", "CommandConfig", "CommandHarness", "CommandTranslator",
           "wire_twin"]

RAW_BYTES_EVENT = "corral.stdout.bytes"
STDERR_MESSAGE_CHARS = 1000


class _WireEvents:
    """The events this harness makes, built directly in their wire form: the dicts
    :func:`corral.harness._events.event_to_dict` makes of the AG-UI models (same keys, same
    order; ``tests/harness/test_command_wire.py`` holds them equal), without importing the
    AG-UI models (start-up cost of a takeover: ``corral attach``)."""

    @staticmethod
    def run_started(thread_id: str, run_id: str) -> dict[str, Any]:
        return {"type": "RUN_STARTED", "threadId": thread_id, "runId": run_id}

    @staticmethod
    def run_finished(thread_id: str, run_id: str) -> dict[str, Any]:
        return {"type": "RUN_FINISHED", "threadId": thread_id, "runId": run_id}

    @staticmethod
    def run_error(message: str, code: str, metadata: dict[str, Any]) -> dict[str, Any]:
        # the AG-UI model's field order
        return {"type": "RUN_ERROR", "metadata": metadata, "message": message, "code": code}

    @staticmethod
    def text_start(message_id: str) -> dict[str, Any]:
        return {"type": "TEXT_MESSAGE_START", "messageId": message_id, "role": "assistant"}

    @staticmethod
    def text_content(message_id: str, delta: str) -> dict[str, Any]:
        if not delta:
            raise ValueError("a TEXT_MESSAGE_CONTENT delta must not be empty")
        return {"type": "TEXT_MESSAGE_CONTENT", "messageId": message_id, "delta": delta}

    @staticmethod
    def text_end(message_id: str) -> dict[str, Any]:
        return {"type": "TEXT_MESSAGE_END", "messageId": message_id}

    @staticmethod
    def custom(name: str, value: Any) -> dict[str, Any]:
        return {"type": "CUSTOM", "name": name, "value": value}


class CommandTranslator:
    """Stdout lines → one text message; exit → ``RUN_FINISHED`` / ``RUN_ERROR``."""

    def __init__(self, ctx: RunContext, *, max_delta_chars: int = 1 << 20,
                 _wire: bool = False) -> None:
        """``_wire`` (for :func:`wire_twin` only): make the events' wire dicts instead of
        the AG-UI models (typed as the models all the same: only the produce path, which
        logs wire dicts, gets such a translator)."""
        if max_delta_chars < 1:
            raise ConfigError("max_delta_chars must be at least 1")
        ev: Any
        if _wire:
            ev = _WireEvents
        else:
            # Here rather than at the top for start-up cost: see _WireEvents.
            from corral.harness import _events as ev
        self._ev: Any = ev
        self.ctx = ctx
        self.message_id = f"{ctx.run_id}-m0"
        self.max_delta_chars = max_delta_chars
        self.finished = False

    def start(self) -> list[BaseEvent]:
        ev = self._ev
        return [ev.run_started(self.ctx.thread_id, self.ctx.run_id), ev.text_start(self.message_id)]

    def feed(self, item: JournalItem) -> list[BaseEvent]:
        if self.finished:
            return []
        if isinstance(item, Line):
            return self._line(item)
        self.finished = True
        return [self._ev.text_end(self.message_id), self._terminal(item)]

    def _line(self, line: Line) -> list[BaseEvent]:
        out: list[BaseEvent] = []
        raw: bytes | None = None
        try:
            text = line.data.decode("utf-8")
        except UnicodeDecodeError:
            text = line.data.decode("utf-8", "replace")
            raw = line.data
        if line.start_offset > 0:
            text = "\n" + text
        if raw is not None:
            payload = {
                "offset": line.start_offset,
                "chars": len(text),
                "base64": base64.b64encode(raw).decode(),
            }
            out.append(self._ev.custom(RAW_BYTES_EVENT, payload))
        step = self.max_delta_chars
        text_content = self._ev.text_content
        out.extend(text_content(self.message_id, text[i : i + step])
                   for i in range(0, len(text), step))
        return out

    def _terminal(self, exit: Exit) -> BaseEvent:
        if exit.code == 0 and exit.signal is None:
            finished: BaseEvent = self._ev.run_finished(self.ctx.thread_id, self.ctx.run_id)
            return finished
        signum = exit.signal
        if signum is None and 128 < exit.code < 128 + 65:
            # Sandboxes whose init reports a child's signal death as 128+N (bubblewrap,
            # containers) cannot tell it from `exit 128+N`; shells use the same convention,
            # so name the signal rather than hide it.
            signum = exit.code - 128
        if signum is not None:
            name = signal_name(signum)
            message = f"command killed by {name} (exit code {exit.code})"
            code = f"signal:{name}"
        else:
            message = f"command exited with code {exit.code}"
            code = f"exit:{exit.code}"
        tail = exit.stderr_tail.decode("utf-8", "replace").strip()
        if tail:
            message += ": " + tail[-STDERR_MESSAGE_CHARS:]
        meta = {"exitCode": exit.code, "signal": signal_name(signum) if signum else None}
        out: BaseEvent = self._ev.run_error(message, code, meta)
        return out


class CommandConfig:
    """The command harness's configuration: the run's command (``argv``, a non-empty list
    of strings); other options are ignored (``corral run --model M -- CMD`` runs
    ``CMD``). A configuration model as the registry uses them
    (:class:`corral.harness._registry.ConfigModel`), without pydantic: a driver taking over
    a command run (``corral attach``) would otherwise import it before its first event."""

    @classmethod
    def factory_kwargs(cls, name: str, config: Mapping[str, Any]) -> dict[str, Any]:
        """``{"argv": [...]}`` (a one-line :class:`ConfigError` for a missing or bad
        command)."""
        argv = config.get("argv")
        if not isinstance(argv, list | tuple) or not argv or \
                not all(isinstance(a, str) for a in argv):
            raise ConfigError(f"the {name} harness needs a command: a non-empty list of "
                              "strings")
        return {"argv": list(argv)}


class CommandHarness:
    """Runs a fixed argv (or ``request.options["argv"]``); the prompt, if any, is its stdin."""

    name = "command"
    resume: Literal["offset", "replay"] = "offset"
    config_model: ClassVar[type[CommandConfig]] = CommandConfig

    def __init__(self, argv: Sequence[str] | None = None, *, max_delta_chars: int = 1 << 20):
        if isinstance(argv, str):
            raise ConfigError(
                "the command harness takes argv as a list of strings, not one string; "
                "use ['sh', '-c', '...'] to run a shell command line"
            )
        self.argv = list(argv) if argv is not None else None
        self.max_delta_chars = max_delta_chars

    def build_command(self, request: AgentRequest) -> AgentCommand:
        argv = request.options.get("argv", self.argv)
        if (
            not isinstance(argv, (list, tuple))
            or not argv
            or not all(isinstance(a, str) and "\0" not in a for a in argv)
            or not argv[0]
        ):
            raise ConfigError(
                "the command harness needs argv: a non-empty list of strings without NUL "
                "bytes (CommandHarness(argv=[...]) or options={'argv': [...]})"
            )
        stdin = request.prompt.encode("utf-8") if request.prompt is not None else None
        return AgentCommand(argv=list(argv), env=dict(request.env), cwd=request.workdir,
                            stdin=stdin)

    def translator(self, ctx: RunContext, *, at_offset: int | None = None) -> CommandTranslator:
        # State depends on nothing but the offset: a line's first-ness is in the line itself.
        return CommandTranslator(ctx, max_delta_chars=self.max_delta_chars)


class _WireCommandHarness(CommandHarness):
    """A :class:`CommandHarness` whose translators make wire dicts (see :func:`wire_twin`)."""

    def translator(self, ctx: RunContext, *, at_offset: int | None = None) -> CommandTranslator:
        return CommandTranslator(ctx, max_delta_chars=self.max_delta_chars, _wire=True)


def wire_twin(harness: Harness) -> Harness | None:
    """For a plain :class:`CommandHarness`: the same harness with translators whose events
    are already their wire dicts (what :func:`corral.harness._events.event_to_dict` makes of
    the models), so a driver of a command run never imports the AG-UI models (start-up cost
    of ``corral attach``). ``None`` for any other harness (a subclass may translate
    otherwise)."""
    if type(harness) is not CommandHarness:
        return None
    return _WireCommandHarness(harness.argv, max_delta_chars=harness.max_delta_chars)
