"""Secrets as opaque references.

``Secrets(GITHUB_TOKEN="…")`` holds values; the rest of a definition only ever holds
:class:`SecretRef` names. Values reach processes only as environment variables at exec
time (never a create-time spec, a file in the workspace, argv, a store, a log or an
event). ``repr``, ``str``, pickling and :meth:`Secrets.to_dict` never show a value, and
every live ``Secrets`` object is known to :func:`corral.sandbox._redact.live_redactor`.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from corral._errors import ConfigError
from corral.sandbox._contracts import check_env_name
from corral.sandbox._redact import Redactor, register_live

__all__ = ["MAX_SECRET_FILE", "SecretRef", "Secrets"]

MAX_SECRET_FILE = 64 * 1024
"""Bytes a secret file may hold (a token or a key, not a data file)."""


@dataclass(frozen=True, slots=True)
class SecretRef:
    """A reference to a secret by name. It carries no value."""

    name: str

    def __str__(self) -> str:
        return f"<secret {self.name}>"


class Secrets(Mapping[str, SecretRef]):
    """A set of named secret values, exposed as :class:`SecretRef` objects.

    ``secrets["TOKEN"]`` and ``secrets.TOKEN`` give the ref; :meth:`resolve` and
    :meth:`env` give values and are meant for the exec path only.
    """

    __slots__ = ("__origins", "__values", "__weakref__")

    def __init__(self, values: Mapping[str, str] | None = None, /, **named: str) -> None:
        merged: dict[str, str] = dict(values or {})
        for k, val in named.items():
            if k in merged:
                raise ConfigError(f"secrets.{k}: given twice")
            merged[k] = val
        for name, value in merged.items():
            # it becomes an environment variable of the sandboxed command (only)
            check_env_name(name, "secret")
            if not isinstance(value, str) or not value:
                raise ConfigError(f"secrets.{name}: the value must be a non-empty string")
            if "\x00" in value:
                raise ConfigError(f"secrets.{name}: the value contains a NUL byte")
        self.__values = merged
        self.__origins: dict[str, dict[str, str]] = {}
        register_live(self)

    # -------------------------------------------------------------- construction
    @classmethod
    def from_env(cls, names: Iterable[str], environ: Mapping[str, str] | None = None) -> Secrets:
        """Read each named secret from the host environment; a missing one is an error."""
        env = os.environ if environ is None else environ
        values: dict[str, str] = {}
        for name in names:
            if not env.get(name):
                raise ConfigError(
                    f"secrets.{name}: environment variable {name} is not set on the host; "
                    "export it before running corral"
                )
            values[name] = env[name]
        return cls(values)

    @classmethod
    def from_sources(
        cls, sources: Mapping[str, Mapping[str, str]], environ: Mapping[str, str] | None = None
    ) -> Secrets:
        """Build from ``{NAME: {"env": VAR}}`` or ``{NAME: {"file": PATH}}`` entries."""
        env = os.environ if environ is None else environ
        values: dict[str, str] = {}
        for name, spec in sources.items():
            if (
                not isinstance(spec, Mapping)
                or len(spec) != 1
                or not (set(spec) <= {"env", "file"})
            ):
                raise ConfigError(
                    f'secrets.{name}: write {{ env = "VAR" }} or {{ file = "PATH" }}; '
                    "secret values never go in the definition itself"
                )
            check_env_name(name, "secret")  # before any file is read for it
            (kind, where), = spec.items()
            if not isinstance(where, str) or not where:
                raise ConfigError(f"secrets.{name}: {kind} must be a non-empty string")
            if kind == "env":
                if not env.get(where):
                    raise ConfigError(
                        f"secrets.{name}: environment variable {where} is not set on the host"
                    )
                values[name] = env[where]
            else:
                values[name] = _read_secret_file(name, Path(where).expanduser())
        out = cls(values)
        out.__origins = {name: dict(spec) for name, spec in sources.items()}
        return out

    def origins(self) -> dict[str, dict[str, str]]:
        """Where each value was read from (``{"env": VAR}`` / ``{"file": PATH}``), if known."""
        return {name: dict(spec) for name, spec in self.__origins.items()}

    # -------------------------------------------------------------- mapping of refs
    def __getitem__(self, name: str) -> SecretRef:
        if name not in self.__values:
            raise KeyError(name)
        return SecretRef(name)

    def __getattr__(self, name: str) -> SecretRef:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"no secret named {name!r}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self.__values))

    def __len__(self) -> int:
        return len(self.__values)

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self.__values))

    # -------------------------------------------------------------- values (exec path only)
    def resolve(self, ref: SecretRef | str) -> str:
        """The value behind a ref; raises :class:`ConfigError` for an unknown name."""
        name = ref.name if isinstance(ref, SecretRef) else ref
        try:
            return self.__values[name]
        except KeyError:
            raise ConfigError(
                f"unknown secret {name!r}; defined: {', '.join(self.names()) or 'none'}"
            ) from None

    def env(self) -> dict[str, str]:
        """``NAME -> value`` for a process environment at exec time."""
        return dict(self.__values)

    def redactor(self) -> Redactor:
        """A redactor that knows exactly these values."""
        return Redactor(self.__values)

    def merged(self, other: Secrets) -> Secrets:
        """A new set with ``other``'s values added (``other`` wins on a clash)."""
        out = dict(self.__values)
        out.update(other.__values)
        merged = Secrets(out)
        merged.__origins = {**self.__origins, **other.__origins}
        return merged

    def _redaction_items(self) -> Iterable[tuple[str, str]]:
        return self.__values.items()

    # -------------------------------------------------------------- never leak
    def to_dict(self) -> dict[str, Any]:
        """Plain data without values (names only)."""
        return {"names": list(self.names())}

    def __repr__(self) -> str:
        return f"Secrets({', '.join(f'{n}=<secret>' for n in self.names())})"

    __str__ = __repr__

    def __reduce__(self) -> NoReturn:
        raise TypeError("Secrets cannot be pickled (values never leave the process)")

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)


def _read_secret_file(name: str, path: Path) -> str:
    """The text of a secret file, without its trailing newlines.

    The path comes from a definition, maybe a repository's own corral.toml: ``/dev/zero``
    would grow this (root) process until memory ran out, a FIFO or ``/dev/stdin`` would hang
    it. Only a regular file of at most :data:`MAX_SECRET_FILE` bytes is read. Symlinks are
    followed: a user's own secret is often a link (into a secrets mount, a dotfile repo),
    and where a repository's file may read from is checked by the caller on the resolved
    path."""
    where = f"secrets.{name}: {path}"
    try:
        # stat first: a device is never opened (opening one can act: a tape rewinds)
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise ConfigError(f"{where} is not a regular file")
        # O_NONBLOCK: a FIFO swapped in after the stat must not block the open
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped between the stat and the open
            raise ConfigError(f"{where} is not a regular file")
        too_big = ConfigError(f"{where} holds more than {MAX_SECRET_FILE} bytes, the most a "
                              "secret file may hold")
        if st.st_size > MAX_SECRET_FILE:
            raise too_big
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_SECRET_FILE:  # it may grow while read: the cap holds regardless
            chunk = os.read(fd, MAX_SECRET_FILE + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_SECRET_FILE:
            raise too_big
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it: {exc.strerror}") from None
    finally:
        os.close(fd)
    try:
        return b"".join(chunks).decode("utf-8").strip("\n")
    except UnicodeDecodeError:
        raise ConfigError(f"{where} is not UTF-8 text") from None
