"""The workspace: source, setup plan, scripts, instructions, secrets.

The setup plan is data (never a closure, so editing it always changes the workspace
hash): a sequence of :class:`Step` (run one after another in one shell that keeps ``cd``
and ``export``) and :class:`Parallel` groups (run at once, each from the shell's current
directory and environment; what they change is not carried on).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from corral._errors import ConfigError
import corral._validate as v
from corral.sandbox._secrets import Secrets
from corral.sandbox._sources import Files, GitSource, LocalDir, NoSource, Source

__all__ = [
    "Parallel",
    "SetupItem",
    "Step",
    "Workspace",
    "canonical_json",
    "parallel",
    "setup_from_data",
]

DEFAULT_STEP_TIMEOUT = 30 * 60.0


def canonical_json(data: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 as is: the form every hash in corral uses."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class Step:
    """One setup command, run with the shell state left by the previous serial step."""

    run: str
    timeout: float = DEFAULT_STEP_TIMEOUT

    def __post_init__(self) -> None:
        v.string(self.run, "workspace.setup step")
        object.__setattr__(self, "timeout", v.duration(self.timeout, "workspace.setup timeout"))

    def to_data(self) -> Any:
        if self.timeout == DEFAULT_STEP_TIMEOUT:
            return self.run
        return {"run": self.run, "timeout": self.timeout}


@dataclass(frozen=True)
class Parallel:
    """Setup commands run at the same time."""

    steps: tuple[Step, ...]

    def __post_init__(self) -> None:
        steps = tuple(s if isinstance(s, Step) else Step(s) for s in self.steps)
        if not steps:
            raise ConfigError("workspace.setup: a parallel group needs at least one command")
        object.__setattr__(self, "steps", steps)

    def to_data(self) -> Any:
        return {"parallel": [s.to_data() for s in self.steps]}


SetupItem = Step | Parallel


def parallel(*commands: str | Step) -> Parallel:
    """A parallel group: ``parallel("make a", "make b")``."""
    return Parallel(tuple(c if isinstance(c, Step) else Step(c) for c in commands))


def setup_from_data(data: object, field_name: str = "workspace.setup") -> tuple[SetupItem, ...]:
    """Normalize a setup plan from strings, dicts (``run``/``parallel``) and objects."""
    if data is None:
        return ()
    if isinstance(data, str) or not isinstance(data, Iterable):
        raise ConfigError(f"{field_name}: expected a list of commands")
    items: list[SetupItem] = []
    for i, item in enumerate(data):
        where = f"{field_name}[{i}]"
        if isinstance(item, Step | Parallel):
            items.append(item)
        elif isinstance(item, str):
            items.append(Step(v.string(item, where)))
        elif isinstance(item, Mapping):
            if "parallel" in item:
                v.no_unknown(item, ("parallel",), where)
                cmds = item["parallel"]
                if isinstance(cmds, str) or not isinstance(cmds, Iterable):
                    raise ConfigError(f"{where}.parallel: expected a list of commands")
                items.append(
                    Parallel(tuple(_step(c, f"{where}.parallel[{j}]") for j, c in enumerate(cmds)))
                )
            else:
                items.append(_step(item, where))
        else:
            raise ConfigError(
                f"{where}: expected a command string, {{run = ...}} or {{parallel = [...]}}"
            )
    return tuple(items)


def _step(item: object, where: str) -> Step:
    if isinstance(item, Step):
        return item
    if isinstance(item, str):
        return Step(v.string(item, where))
    if isinstance(item, Mapping):
        v.no_unknown(item, ("run", "timeout"), where)
        if "run" not in item:
            raise ConfigError(f"{where}.run: required")
        return Step(
            v.string(item["run"], f"{where}.run"),
            v.duration(item.get("timeout", DEFAULT_STEP_TIMEOUT), f"{where}.timeout"),
        )
    raise ConfigError(f"{where}: expected a command string or {{run = ...}}")


@dataclass(frozen=True)
class Workspace:
    """What the agent sees.

    ``scripts`` are named commands listed in AGENTS.md; ``instructions`` become
    AGENTS.md (linked as CLAUDE.md and GEMINI.md). ``secrets`` never enter the hash.
    ``max_copy_size`` caps the bytes of file contents copied from the host into the
    sandbox (a local directory or a git clone): bytes or a string such as ``"4GiB"``;
    ``None`` means ``$CORRAL_MAX_COPY_SIZE``, else 1 GiB. It is not part of the hash.
    """

    source: Source = field(default_factory=NoSource)
    setup: Sequence[SetupItem | str] = ()
    scripts: Mapping[str, str] = field(default_factory=dict)
    instructions: str | None = None
    secrets: Secrets = field(default_factory=Secrets)
    max_copy_size: int | str | None = None

    def __post_init__(self) -> None:
        src = self.source
        if src is None:
            object.__setattr__(self, "source", NoSource())
        elif not isinstance(src, GitSource | LocalDir | Files | NoSource):
            raise ConfigError(
                "workspace.source: expected GitSource, LocalDir, Files or None, "
                f"got {type(src).__name__}"
            )
        object.__setattr__(self, "setup", setup_from_data(self.setup))
        object.__setattr__(
            self, "scripts", dict(sorted(v.str_map(self.scripts, "workspace.scripts").items()))
        )
        if self.instructions is not None:
            v.string(self.instructions, "workspace.instructions", allow_empty=True)
        if self.max_copy_size is not None:
            object.__setattr__(
                self, "max_copy_size", v.size(self.max_copy_size, "workspace.max_copy_size")
            )
        if not isinstance(self.secrets, Secrets):
            raise ConfigError("workspace.secrets: expected a corral.Secrets object")
        src = self.source
        if isinstance(src, GitSource) and src.auth and src.auth.name not in self.secrets:
            raise ConfigError(
                f"workspace.source.auth: no secret named {src.auth.name!r} in workspace.secrets"
            )

    @property
    def steps(self) -> tuple[SetupItem, ...]:
        return tuple(self.setup)  # type: ignore[arg-type]

    @property
    def copy_limit_bytes(self) -> int | None:
        """``max_copy_size`` in bytes, or ``None`` when not set."""
        limit = self.max_copy_size
        return limit if isinstance(limit, int) else None

    def to_dict(self) -> dict[str, Any]:
        """Canonical plain data; secret *names* only."""
        data: dict[str, Any] = {
            "source": self.source.to_dict(),
            "setup": [item.to_data() for item in self.steps],
            "scripts": dict(self.scripts),
            "instructions": self.instructions,
            "secrets": list(self.secrets.names()),
        }
        if self.max_copy_size is not None:
            data["max_copy_size"] = self.max_copy_size
        return data

    def hash(self) -> str:
        """SHA-256 over the canonical form (no secret values, so rotation keeps the key).
        The copy limit is left out: it changes no content, so raising it keeps the key."""
        data = self.to_dict()
        data.pop("max_copy_size", None)
        return hashlib.sha256(canonical_json(data).encode()).hexdigest()
