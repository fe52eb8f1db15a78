"""Lifecycle: how long a sandbox lives and who may reuse it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import corral._validate as v
from corral._errors import ConfigError

__all__ = ["CheckpointMode", "DEFAULT_CHECKPOINT_MAX_SIZE", "DEFAULT_KEEP_ALIVE", "Lifecycle",
           "Reuse", "SnapshotMode"]

Reuse = Literal["thread", "run", "none"]
SnapshotMode = Literal["after-setup", "after-run", "none"]
CheckpointMode = Literal["after-run", "none"]
DEFAULT_KEEP_ALIVE = 24 * 3600.0
DEFAULT_CHECKPOINT_MAX_SIZE = 1 << 30
"""The default cap of a thread's workspace checkpoint: 1 GiB of file content."""


@dataclass(frozen=True)
class Lifecycle:
    """When sandboxes are reused, snapshotted and collected.

    * ``reuse="thread"``: runs of one thread share a sandbox; ``"run"``: one sandbox per
      run (a second host taking the run over finds it again), kept after the run until
      ``keep_alive``; ``"none"``: one per run, destroyed when the run completes.
    * ``snapshot``: ``"after-setup"`` snapshots a freshly bootstrapped sandbox, so a lost
      sandbox comes back without running setup again; ``"after-run"`` snapshots after
      every run; ``"none"``. A provider without snapshots raises rather than skipping.
    * ``keep_alive``: seconds (or ``"30m"``, ``"2h"``, ``"7d"``) a sandbox may sit idle
      before ``corral gc`` (and the reaper sweep) destroys it; ``None`` = never.
    * ``destroy_on_complete``: destroy when a run ends; defaults to True for
      ``reuse="none"`` and False otherwise.
    * ``checkpoint``: ``"after-run"`` (the default) records, when a run of a named thread
      ends, a checkpoint of the workspace and the saved agent session in the store, which
      any host restores into a fresh sandbox of the thread (and undo and fork use);
      ``"none"`` records none.
    * ``checkpoint_max_size``: the most file content (bytes, or ``"500MiB"``) a checkpoint
      holds, default 1 GiB; over it ``on_checkpoint_too_large`` decides: ``"error"`` (the
      run's record says the checkpoint failed, and undo past that turn is refused) or
      ``"skip"`` (a warning). Neither fails the run.
    """

    reuse: Reuse = "thread"
    snapshot: SnapshotMode = "none"
    keep_alive: float | str | None = DEFAULT_KEEP_ALIVE
    destroy_on_complete: bool | None = None
    checkpoint: CheckpointMode = "after-run"
    checkpoint_max_size: int | str = DEFAULT_CHECKPOINT_MAX_SIZE
    on_checkpoint_too_large: Literal["error", "skip"] = "error"

    def __post_init__(self) -> None:
        v.choice(self.checkpoint, "lifecycle.checkpoint", ("after-run", "none"))
        v.choice(self.on_checkpoint_too_large, "lifecycle.on_checkpoint_too_large",
                 ("error", "skip"))
        object.__setattr__(self, "checkpoint_max_size",
                           v.size(self.checkpoint_max_size, "lifecycle.checkpoint_max_size"))
        v.choice(self.reuse, "lifecycle.reuse", ("thread", "run", "none"))
        v.choice(self.snapshot, "lifecycle.snapshot", ("after-setup", "after-run", "none"))
        if self.keep_alive is not None and self.keep_alive != "never":
            object.__setattr__(
                self, "keep_alive", v.duration(self.keep_alive, "lifecycle.keep_alive")
            )
        else:
            object.__setattr__(self, "keep_alive", None)
        if self.destroy_on_complete is None:
            object.__setattr__(self, "destroy_on_complete", self.reuse == "none")
        elif not isinstance(self.destroy_on_complete, bool):

            raise ConfigError("lifecycle.destroy_on_complete: expected true or false")

    @property
    def keep_alive_seconds(self) -> float | None:
        return self.keep_alive if isinstance(self.keep_alive, float) else None

    @property
    def destroys_on_complete(self) -> bool:
        return bool(self.destroy_on_complete)

    @property
    def checkpoint_max_bytes(self) -> int:
        """``checkpoint_max_size`` in bytes."""
        size = self.checkpoint_max_size
        return size if isinstance(size, int) else DEFAULT_CHECKPOINT_MAX_SIZE

    def to_dict(self) -> dict[str, Any]:
        return {
            "reuse": self.reuse,
            "snapshot": self.snapshot,
            "keep_alive": self.keep_alive_seconds if self.keep_alive is not None else "never",
            "destroy_on_complete": self.destroys_on_complete,
            "checkpoint": self.checkpoint,
            "checkpoint_max_size": self.checkpoint_max_bytes,
            "on_checkpoint_too_large": self.on_checkpoint_too_large,
        }
