"""What the local and bubblewrap handles share: a host state directory per sandbox."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path

from corral._errors import ConfigError
from corral.providers._hostfs import HostFS
from corral.providers._state import SandboxState
from corral.sandbox._contracts import (
    Capabilities,
    Command,
    HostCommand,
    ProcessApi,
    SandboxRef,
    UnsupportedCapability,
)
from corral.sandbox._contracts import SandboxGoneError

__all__ = ["WORKDIR", "HostDirHandle"]

WORKDIR = "/workspace"


class HostDirHandle:
    """Base of handles whose files live in ``<sandbox_dir>/root`` on the host."""

    provider_name = ""

    def __init__(
        self,
        sandbox_dir: Path | str,
        state: SandboxState,
        capabilities: Capabilities,
        owner: tuple[int, int] | None = None,
    ) -> None:
        # The paths and the file API are made on first use: a handle is made per create,
        # and building Path objects is a good part of the local provider's create time.
        self._dir_name = str(sandbox_dir)
        self._state = state
        self._caps = capabilities
        self._owner = owner

    @cached_property
    def _dir(self) -> Path:
        return Path(self._dir_name)

    @cached_property
    def _files(self) -> Path:
        return Path(self._state.files_dir or self._dir_name)

    @cached_property
    def _fs(self) -> HostFS:
        return HostFS(self._files / "root", workdir=WORKDIR, owner=self._owner)

    @property
    def id(self) -> str:
        return self._state.id

    @property
    def ref(self) -> SandboxRef:
        return SandboxRef(self.provider_name, self._state.id)

    @property
    def workdir(self) -> str:
        return WORKDIR

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    @property
    def fs(self) -> HostFS:
        return self._fs

    @property
    def process(self) -> ProcessApi:
        raise NotImplementedError

    @property
    def state(self) -> SandboxState:
        return self._state

    @property
    def created_at(self) -> float:
        return self._state.created_at

    @property
    def labels(self) -> Mapping[str, str]:
        return dict(self._state.labels)

    @property
    def binds(self) -> Sequence[tuple[str, str]]:
        return [(str(host), str(inside)) for host, inside in self._state.binds]

    @property
    def state_dir(self) -> str:
        """The sandbox's host-side state directory (holds ``root/`` and ``private/``)."""
        return self._dir_name

    @property
    def host_root(self) -> str:
        """The host directory that mirrors the sandbox's writable areas."""
        return str(self._files / "root")

    @property
    def private_dir(self) -> str:
        """Host-only directory of this sandbox, never visible inside it."""
        return str(self._dir / "private")

    def host_path(self, sandbox_path: str) -> str:
        """The host path behind a sandbox path (lexically; for display and launchers)."""
        return str(self._files / "root" / self._fs.to_relative(sandbox_path))

    async def connect_port(self, port: int) -> str:
        raise UnsupportedCapability(
            self.provider_name, "ports", "expose the service over a unix socket bind instead"
        )

    def host_command(
        self,
        command: Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> HostCommand:
        raise NotImplementedError

    def _check_alive(self) -> None:

        if not (self._dir / "state.json").exists():
            raise SandboxGoneError(
                f"sandbox {self.id!r} ({self.provider_name}) no longer exists; create a new one"
            )

    def _check_cwd(self, cwd: str | None) -> str:
        """Return the sandbox cwd after confinement and existence checks."""
        want = cwd or WORKDIR
        rel = self._fs.to_relative(want)
        host = self._files / "root" / rel
        if not host.is_dir():
            raise ConfigError(f"working directory {want!r} does not exist in sandbox {self.id!r}")
        return "/" + rel
