"""The harness contract: how to launch an agent CLI and how to translate its journal.

A :class:`Harness` builds the agent's argv/env (:meth:`Harness.build_command`) and makes
:class:`Translator` s. A translator is a **pure, deterministic state machine** from journal
items (:class:`~corral.journal._reader.Line`, then one :class:`~corral.journal._reader.Exit`) to
AG-UI events: no clock, no randomness, no I/O; ids are derived from the run id and journal
offsets (e.g. a message that starts at journal offset ``s`` is ``f"{run_id}-m{s}"``).

Resumability rule (what the Runner must do so a successor host continuing a run emits exactly
the events an uninterrupted translation would have emitted, no duplicate, no gap):

1. Translate with :func:`translate_run`. It yields :class:`Batch` es: first the batch of
   ``Translator.start()`` (``journal_offset == 0``, ``item is None``), then one batch per
   journal item that produced events (``journal_offset == item.end_offset``). Items that
   produce no events yield no batch.
2. Append each batch's events to the event log **in one atomic append** (never split a
   batch), recording ``batch.journal_offset`` with every event of the batch.
3. A successor reads the log's last event that carries a journal offset: none → call
   ``translate_run(..., after=None)`` (fresh: it starts with the ``start()`` batch); offset
   ``N`` → ``translate_run(..., after=N)``, which rebuilds the translator's state at ``N``
   (:func:`translator_at`) and continues with the first item after ``N``.
4. Never stamp anything derived from the host (time, hostname) *into* the events before
   comparing them; the log may add timestamps on append.

Because batches are atomic and state at ``N`` is a function of the journal prefix, the
successor's batches are exactly the uninterrupted run's batches after ``N``.

How state at ``N`` is rebuilt depends on :attr:`Harness.resume`: ``"offset"`` — the
translator's state at any item boundary is a function of ``N`` alone (O(1));
``"replay"`` — the translator is fed the journal items from 0 to ``N`` with their events
discarded (cost linear in the prefix, only at takeover).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from corral.journal._reader import Exit, JournalItem, Opener, default_open, read_journal
from corral.journal._layout import JournalPaths

if TYPE_CHECKING:
    # Annotations only: importing the AG-UI models costs a driver's start-up (``corral
    # attach`` of a command run never builds them, see corral.harness._command.wire_twin).
    from ag_ui.core import BaseEvent

__all__ = [
    "AgentCommand",
    "AgentRequest",
    "Batch",
    "Harness",
    "NeedsAgentRuntime",
    "RunContext",
    "SESSION_LOST_EVENT",
    "Translator",
    "translate_run",
    "translator_at",
]


SESSION_LOST_EVENT = "corral.session_lost"
"""CUSTOM event of a run that was to continue the thread's saved CLI session but began a
new conversation: ``{"harness", "expected", "reason", "sessionId"?}`` (``expected``: the
session id it was to continue; ``sessionId``: the new one, when known). Logged before
the run's first message (docs/threads.md)."""


@dataclass(frozen=True, slots=True)
class RunContext:
    """Identity of the run being translated (ids in events derive from these only)."""

    run_id: str
    thread_id: str
    resumed_session: str | None = None
    """The saved CLI session the run was started to continue (``spec.agent
    .resumed_session``), if any: a translator that sees the agent start another session
    says so (``CUSTOM corral.session_lost``), and one whose CLI refuses it says that."""


@dataclass(frozen=True, slots=True)
class AgentRequest:
    """What the caller asked the agent to do."""

    prompt: str | None = None
    workdir: str = "/workspace"
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment for the agent (policy/secrets layers fill this)."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """Harness-specific options (e.g. ``{"argv": [...]}`` for ``command``)."""


@dataclass(frozen=True, slots=True)
class AgentCommand:
    """The in-sandbox process to start: argv, environment, cwd and stdin bytes."""

    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    stdin: bytes | None = None
    timeout: float | None = None
    """Seconds the process may run; enforced on the host by the supervisor (out of the
    agent's reach), which then records exit code 124."""


@runtime_checkable
class Translator(Protocol):
    """Journal items → AG-UI events. Pure and deterministic (see the module docstring)."""

    def start(self) -> list[BaseEvent]:
        """Events before any journal byte (``RUN_STARTED`` first)."""
        ...

    def feed(self, item: JournalItem) -> list[BaseEvent]:
        """Events for one item; the :class:`Exit` item yields the terminal event."""
        ...


@runtime_checkable
class Harness(Protocol):
    """An agent CLI adapter."""

    @property
    def name(self) -> str: ...

    @property
    def resume(self) -> Literal["offset", "replay"]:
        """How :func:`translator_at` rebuilds state (see the module docstring)."""
        ...

    def build_command(self, request: AgentRequest) -> AgentCommand:
        """The agent's argv/env/cwd/stdin. Raises ``ConfigError`` for a bad request."""
        ...

    def translator(self, ctx: RunContext, *, at_offset: int | None = None) -> Translator:
        """A fresh translator; with ``at_offset`` (``resume == "offset"`` only), one already in
        its state after all items ending at or before that offset, ``start()`` included."""
        ...


@runtime_checkable
class NeedsAgentRuntime(Protocol):
    """A harness whose runs need the agent runtime (installs, the services daemon with the
    model proxy, sessions): every agent-CLI harness. A run of any other harness is driven,
    taken over and finished without loading that stack."""

    @property
    def needs_agent_runtime(self) -> Literal[True]: ...


@dataclass(frozen=True, slots=True)
class Batch:
    """Events to append atomically, with the journal offset they were translated up to."""

    events: list[BaseEvent]
    journal_offset: int
    item: JournalItem | None
    """The item translated (``None`` for the ``start()`` batch)."""

    @property
    def exit(self) -> Exit | None:
        return self.item if isinstance(self.item, Exit) else None


async def translator_at(
    harness: Harness,
    ctx: RunContext,
    journal: JournalPaths | str | os.PathLike[str],
    *,
    nonce: str | bytes,
    offset: int,
    opener: Opener = default_open,
) -> Translator:
    """The translator in the state an uninterrupted translation had after ``offset``."""
    if harness.resume == "offset":
        return harness.translator(ctx, at_offset=offset)
    t = harness.translator(ctx)
    t.start()
    if offset == 0:
        return t
    async for item in read_journal(journal, nonce=nonce, follow=False, opener=opener):
        if item.end_offset > offset:
            break  # cannot happen for a valid offset: the reader yields each boundary
        t.feed(item)
        if item.end_offset == offset:
            return t
    raise ValueError(f"journal offset {offset} is not an item boundary of {journal}")


async def translate_run(
    harness: Harness,
    ctx: RunContext,
    journal: JournalPaths | str | os.PathLike[str],
    *,
    nonce: str | bytes,
    after: int | None = None,
    follow: bool = True,
    poll: float = 0.05,
    opener: Opener = default_open,
    eventless: bool = False,
) -> AsyncIterator[Batch]:
    """Translate a run's journal into atomic :class:`Batch` es (see the module docstring).

    ``after=None``: from the start (the ``start()`` batch first). ``after=N``: continue after
    journal offset ``N`` as recorded with the last logged batch. Ends after the batch of the
    :class:`Exit` item; with ``follow=False`` it may end earlier (no more bytes yet).
    ``eventless``: also yield the (empty) batch of an item that translates to no events, so
    the consumer knows how far the journal has been read.
    """
    if after is None:
        t = harness.translator(ctx)
        first = t.start()
        if first:
            yield Batch(first, 0, None)
        offset = 0
    else:
        t = await translator_at(harness, ctx, journal, nonce=nonce, offset=after, opener=opener)
        offset = after
    reader = read_journal(journal, after=offset, nonce=nonce, follow=follow, poll=poll,
                          opener=opener)
    try:
        async for item in reader:
            events = t.feed(item)
            if events or eventless or isinstance(item, Exit):  # the Runner must see the exit
                yield Batch(events, item.end_offset, item)
    finally:
        await reader.aclose()
