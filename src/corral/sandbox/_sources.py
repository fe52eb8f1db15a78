"""Where a workspace's files come from: a git repository, a host directory, inline files.

Sources are plain data, validated when built. ``to_dict()`` is their canonical form (it
feeds the workspace hash and ``corral.toml``). How each is materialized lives in
:mod:`corral.sandbox._bootstrap`.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from corral._errors import ConfigError
import corral._validate as v
from corral.sandbox._copyguard import refuse_system_dir
from corral.sandbox._secrets import SecretRef

__all__ = [
    "Files",
    "GitSource",
    "LocalDir",
    "NoSource",
    "Source",
    "is_commit_sha",
    "source_from_dict",
]

_SHA_RE = re.compile(r"^[0-9a-f]{40}$|^[0-9a-f]{64}$")
_REF_BAD = re.compile(r"(^-)|(\.\.)|[\x00-\x20~^:?*\[\\]|(@\{)|(\.lock$)|(/$)|(^/)")


def is_commit_sha(ref: str) -> bool:
    """A full SHA-1 or SHA-256 object name (lower-case hex)."""
    return bool(_SHA_RE.match(ref))


@dataclass(frozen=True)
class GitSource:
    """A git repository cloned into the workspace.

    ``ref`` is a branch or tag (or a full commit SHA); ``commit`` pins an exact commit
    (checked out detached; with ``ref`` as well, the local branch ``ref`` is created
    there). ``depth`` is the history depth (``None`` = full history). ``auth`` names a
    secret holding a token for HTTPS; it is handed to git through a credential helper
    reading the environment, never in argv or the remote URL.
    """

    url: str
    ref: str | None = None
    commit: str | None = None
    depth: int | None = 1
    auth: SecretRef | None = None
    kind: Literal["git"] = field(default="git", init=False)

    def __post_init__(self) -> None:
        v.string(self.url, "workspace.source.url")
        if self.url.startswith("-"):
            raise ConfigError("workspace.source.url: must not start with '-'")
        parts = urlsplit(self.url)
        if parts.password or (parts.username and parts.scheme in ("http", "https")):
            raise ConfigError(
                "workspace.source.url: credentials in the URL would be stored in .git/config; "
                "remove them and set workspace.source.auth to a secret instead"
            )
        if self.ref is not None:
            v.string(self.ref, "workspace.source.ref")
            if _REF_BAD.search(self.ref):
                raise ConfigError(f"workspace.source.ref: {self.ref!r} is not a valid git ref")
        if self.commit is not None:
            v.string(self.commit, "workspace.source.commit")
            if not is_commit_sha(self.commit):
                raise ConfigError(
                    f"workspace.source.commit: {self.commit!r} is not a full commit SHA "
                    "(40 lower-case hex characters)"
                )
        if self.depth is not None:
            v.positive_int(self.depth, "workspace.source.depth")
        if self.auth is not None and not isinstance(self.auth, SecretRef):
            raise ConfigError("workspace.source.auth: must be a secret reference (secrets.NAME)")

    @property
    def pinned_commit(self) -> str | None:
        """The exact commit to check out, if the source names one."""
        if self.commit:
            return self.commit
        if self.ref and is_commit_sha(self.ref):
            return self.ref
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "git",
            "url": self.url,
            "ref": self.ref,
            "commit": self.commit,
            "depth": self.depth,
            "auth": self.auth.name if self.auth else None,
        }


@dataclass(frozen=True)
class LocalDir:
    """A host directory copied into the workspace at bootstrap.

    The workspace hash covers the path, not the contents: edit files freely, a changed
    path gets a new sandbox. ``ignore_files=True`` leaves out what the directory's
    ``.gitignore`` and ``.corralignore`` files exclude, and ``.git`` (``corral run
    --workspace`` sets it unless ``--no-ignore``). System directories (``/``, ``/usr``, ``/proc``, …) are refused;
    corral's own state inside the directory is never copied (see
    :mod:`corral.sandbox._copyguard`).
    """

    path: str
    exclude: tuple[str, ...] = ()
    # leave out what .gitignore / .corralignore files exclude, and .git (corral._ignore)
    ignore_files: bool = False
    kind: Literal["local"] = field(default="local", init=False)

    def __post_init__(self) -> None:
        v.string(self.path, "workspace.source.path")
        resolved = str(Path(self.path).expanduser().resolve())
        refuse_system_dir(resolved)
        object.__setattr__(self, "path", resolved)
        object.__setattr__(self, "exclude", v.str_list(self.exclude, "workspace.source.exclude"))
        if not isinstance(self.ignore_files, bool):
            raise ConfigError("workspace.source.ignore_files: expected true or false")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": "local", "path": self.path, "exclude": list(self.exclude)}
        if self.ignore_files:  # only when set: existing definitions keep their hash
            out["ignore_files"] = True
        return out


@dataclass(frozen=True)
class Files:
    """Inline files: relative path -> text (or bytes)."""

    files: Mapping[str, str | bytes]
    kind: Literal["files"] = field(default="files", init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.files, Mapping):
            raise ConfigError("workspace.source.files: expected a table of path = content")
        clean: dict[str, str | bytes] = {}
        for path, content in self.files.items():
            where = f"workspace.source.files[{path!r}]"
            v.string(path, where)
            norm = posixpath.normpath(path)
            if path.startswith("/") or norm == ".." or norm.startswith("../") or norm == ".":
                raise ConfigError(f"{where}: must be a relative path inside the workspace")
            if not isinstance(content, str | bytes):
                raise ConfigError(f"{where}: content must be text or bytes")
            clean[norm] = content
        object.__setattr__(self, "files", dict(sorted(clean.items())))

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "files",
            "files": {
                p: (c if isinstance(c, str) else {"hex": c.hex()}) for p, c in self.files.items()
            },
        }


@dataclass(frozen=True)
class NoSource:
    """An empty workspace."""

    kind: Literal["none"] = field(default="none", init=False)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "none"}


Source = GitSource | LocalDir | Files | NoSource


def source_from_dict(
    data: Mapping[str, Any], secrets: Mapping[str, SecretRef] | None = None
) -> Source:
    """Build a source from plain data (``kind`` = git | local | files | none)."""
    kind = data.get("kind", "git" if "url" in data else "local" if "path" in data else None)
    if kind is None and "files" in data:
        kind = "files"
    if kind is None:
        kind = "none"
    kind = v.choice(kind, "workspace.source.kind", ("git", "local", "files", "none"))
    body = {k: val for k, val in data.items() if k != "kind"}
    known = {
        "git": ("url", "ref", "commit", "depth", "auth"),
        "local": ("path", "exclude", "ignore_files"),
        "files": ("files",),
        "none": (),
    }[kind]
    v.no_unknown(body, known, "workspace.source")
    if kind == "git":
        auth = body.get("auth")
        if auth is not None:
            name = v.string(auth, "workspace.source.auth")
            if secrets is not None and name not in secrets:
                raise ConfigError(f"workspace.source.auth: no secret named {name!r}")
            body["auth"] = SecretRef(name)
        depth = body.get("depth", 1)
        if depth in ("full", 0):
            depth = None
        body["depth"] = depth
        if "url" not in body:
            raise ConfigError("workspace.source.url: required for a git source")
        return GitSource(**body)
    if kind == "local":
        if "path" not in body:
            raise ConfigError("workspace.source.path: required for a local source")
        return LocalDir(path=body["path"], exclude=tuple(body.get("exclude", ())),
                        ignore_files=body.get("ignore_files", False))
    if kind == "files":
        files = body.get("files", {})
        if isinstance(files, Mapping):
            files = {
                k: (bytes.fromhex(c["hex"]) if isinstance(c, Mapping) and "hex" in c else c)
                for k, c in files.items()
            }
        return Files(files)
    return NoSource()
