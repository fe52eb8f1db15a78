"""The Docker SDK, imported on use, and what its errors mean to corral.

The official ``docker`` package (``pip install 'corral[docker]'``) is an optional extra:
this module names it when missing, in one line.
"""

from __future__ import annotations

import os
from typing import Any

from corral._errors import PrerequisiteMissing
from corral._version import __version__

__all__ = ["BASE_IMAGE", "DockerUnavailable", "connect", "daemon_is_local", "docker_errors",
           "unavailable"]

LABEL = "corral"
"""Every container and volume corral makes carries ``corral=1``."""


BASE_IMAGE = f"corral-base:{__version__}"
"""corral's own image (``corral images build`` makes it)."""


def docker_errors() -> Any:
    """The SDK's ``docker.errors`` module (a one-line error when the SDK is missing)."""
    try:
        import docker.errors
    except ImportError:
        raise PrerequisiteMissing(
            "the docker provider needs the Docker SDK: pip install 'corral[docker]'"
        ) from None
    return docker.errors


def connect(docker_host: str | None = None) -> Any:
    """A ``docker.DockerClient`` for ``docker_host`` (default: ``$DOCKER_HOST`` or the
    local socket). The SDK asks the daemon for its API version here: a daemon that does not
    answer is :class:`DockerUnavailable` (the one line with the fix), never the SDK's
    exception."""
    errors = docker_errors()
    import docker

    try:
        if docker_host:
            return docker.DockerClient(base_url=docker_host, timeout=120)
        return docker.from_env(timeout=120)
    except (errors.DockerException, OSError) as exc:
        raise unavailable(exc, docker_host) from None


def daemon_is_local(docker_host: str | None = None) -> bool:
    """Whether the daemon is on this machine (a unix socket): only then can host unix
    sockets be bound into its containers."""
    url = docker_host or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    return url.startswith(("unix://", "npipe://"))


class DockerUnavailable(PrerequisiteMissing):
    """The Docker daemon did not answer."""

    code = "provider_unavailable"


def unavailable(exc: BaseException, docker_host: str | None) -> DockerUnavailable:
    where = docker_host or os.environ.get("DOCKER_HOST") or "the local socket"
    root = _root_os_error(exc)
    if root is not None:  # "No such file or directory", not the SDK's nested reprs
        first = root.strerror or type(root).__name__
    else:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return DockerUnavailable(
        f"the Docker daemon at {where} did not answer ({first}): start dockerd, or set "
        "DOCKER_HOST / [provider] docker_host"
    )


def _root_os_error(exc: BaseException) -> OSError | None:
    """The OS error at the bottom of the SDK's chain of wrapped exceptions (if any)."""
    seen: set[int] = set()
    found: OSError | None = None
    stack: list[BaseException] = [exc]
    while stack:
        cur = stack.pop()
        if id(cur) in seen:
            continue
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.strerror:
            found = cur
        stack.extend(e for e in (cur.__cause__, cur.__context__) if e is not None)
        stack.extend(a for a in cur.args if isinstance(a, BaseException))
    return found
