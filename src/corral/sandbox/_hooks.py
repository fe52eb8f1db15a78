"""Hooks a definition may declare: ready, error, destroy, and file events.

Hooks may be plain functions or coroutines. A hook that raises is logged (redacted) and
swallowed: hooks observe, they do not steer the sandbox.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from corral._errors import ConfigError
from corral.sandbox._redact import get_logger

__all__ = ["FileEvent", "FileEventKind", "Hooks", "call_hook"]

log = get_logger("corral.sandbox._hooks")

FileEventKind = Literal["create", "change", "delete"]


@dataclass(frozen=True)
class FileEvent:
    """A file in the workspace was created, changed or deleted.

    ``path`` is relative to the workspace. :meth:`diff` gives a unified patch against the
    run's git baseline (empty for git-ignored files; a synthesized add patch when the file
    did not exist at the baseline); it never raises.
    """

    kind: FileEventKind
    path: str
    timestamp: float
    _differ: Callable[[str], Awaitable[str]] | None = field(default=None, repr=False, compare=False)

    async def diff(self) -> str:
        if self._differ is None:
            return ""
        try:
            return await self._differ(self.path)
        except Exception as exc:  # noqa: BLE001 - a diff is best effort; log, never raise
            log.warning("diff for %s failed: %s", self.path, exc)
            return ""


Hook = Callable[..., Any]


@dataclass(frozen=True)
class Hooks:
    """Callbacks: ``on_ready(handle)``, ``on_error(exc)``, ``on_destroy(ref)``,
    ``on_file(event)`` for every file event, and ``on_file_create`` / ``on_file_change``
    / ``on_file_delete`` for one kind. ``file_diffs`` computes diffs eagerly for
    ``sandbox.file.diff`` events."""

    on_ready: Hook | None = None
    on_error: Hook | None = None
    on_destroy: Hook | None = None
    on_file: Hook | None = None
    on_file_create: Hook | None = None
    on_file_change: Hook | None = None
    on_file_delete: Hook | None = None
    file_diffs: bool = False

    def __post_init__(self) -> None:
        for name in (
            "on_ready", "on_error", "on_destroy", "on_file",
            "on_file_create", "on_file_change", "on_file_delete",
        ):  # fmt: skip
            hook = getattr(self, name)
            if hook is not None and not callable(hook):
                raise ConfigError(f"hooks.{name}: must be callable")

    @property
    def wants_files(self) -> bool:
        return any(
            h is not None
            for h in (self.on_file, self.on_file_create, self.on_file_change, self.on_file_delete)
        )

    async def file_event(self, event: FileEvent) -> None:
        """Dispatch one file event to ``on_file`` and the per-kind hook, in that order."""
        await call_hook(self.on_file, "on_file", event)
        specific = {
            "create": self.on_file_create,
            "change": self.on_file_change,
            "delete": self.on_file_delete,
        }[event.kind]
        await call_hook(specific, f"on_file_{event.kind}", event)


async def call_hook(hook: Hook | None, name: str, *args: Any) -> None:
    """Call a sync or async hook; log and swallow its errors."""
    if hook is None:
        return
    try:
        result = hook(*args)
        if inspect.isawaitable(result):
            await result
    except Exception as exc:  # noqa: BLE001 - hooks observe; their failures must not break runs
        log.error("hook %s failed: %s: %s", name, type(exc).__name__, exc)
