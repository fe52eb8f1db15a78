"""corral's base image for the docker provider, made locally from Debian packages.

No registry is needed: ``mmdebstrap`` makes a minimal Debian root filesystem (python3, git,
ca-certificates, the agent's user and its writable areas) as a tarball, which the daemon
imports through the API (``corral images build``). Any image with ``/bin/sh`` and
``python3`` works as well (``[provider] image``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from corral._errors import ConfigError, PrerequisiteMissing
from corral.providers._docker_client import BASE_IMAGE, connect, docker_errors, unavailable

__all__ = ["BASE_PACKAGES", "build_base_image", "image_exists", "rootfs_command"]

BASE_PACKAGES = ("python3", "git", "ca-certificates")
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The agent's user and writable areas, made in the root filesystem: new volumes copy the
# mount point's ownership, so a sandbox of this image needs no setup step as root.
_CUSTOMIZE = (
    'echo "agent:x:{uid}:{uid}:corral agent:/home/agent:/bin/sh" >> "$1/etc/passwd" && '
    'echo "agent:x:{uid}:" >> "$1/etc/group" && '
    'mkdir -p "$1/workspace" "$1/home/agent" "$1/run/corral" && '
    'chown {uid}:{uid} "$1/workspace" "$1/home/agent" && chmod 700 "$1/run/corral" && '
    'rm -rf "$1/var/lib/apt/lists/"* "$1/var/cache/apt/"*'
)
_SUITE = re.compile(r"^[a-z][a-z0-9-]{1,30}$")

Progress = Callable[[str], None]


def rootfs_command(out: Path, *, suite: str = "bookworm", uid: int = 1000) -> list[str]:
    """The ``mmdebstrap`` argv that writes the base root filesystem to ``out``."""
    if not _SUITE.match(suite):
        raise ConfigError(f"invalid Debian suite {suite!r}: e.g. bookworm")
    return ["mmdebstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
            "--dpkgopt=path-exclude=/usr/share/doc/*",
            "--dpkgopt=path-exclude=/usr/share/man/*",
            "--dpkgopt=path-exclude=/usr/share/locale/*",
            f"--customize-hook={_CUSTOMIZE.format(uid=int(uid))}",
            suite, str(out)]


def image_exists(tag: str = BASE_IMAGE, *, docker_host: str | None = None) -> bool:
    """Whether the daemon has ``tag``."""
    errors = docker_errors()
    try:
        connect(docker_host).api.inspect_image(tag)
    except errors.ImageNotFound:
        return False
    except errors.DockerException as exc:
        raise unavailable(exc, docker_host) from None
    return True


def mmdebstrap_step(line: str) -> str | None:
    """The progress line for one line of mmdebstrap's output (its ``I:`` lines), ``None``
    for the rest. A hook is named, never echoed: mmdebstrap prints the whole script."""
    if not line.startswith("I: "):
        return None
    text = line[3:]
    if text.startswith("running --") and "-hook" in text.split(" ", 2)[1]:
        return f"running {text.split(' ', 2)[1]}"
    return text


def build_base_image(tag: str = BASE_IMAGE, *, docker_host: str | None = None,
                     suite: str = "bookworm", progress: Progress | None = None) -> str:
    """Make corral's base image and tag it ``tag``; return its id. ``progress`` gets one
    line per step."""
    say = progress or (lambda line: None)
    if shutil.which("mmdebstrap") is None:
        raise PrerequisiteMissing("building the base image needs mmdebstrap: "
                                  "apt-get install mmdebstrap")
    repo, _, version = tag.rpartition(":") if ":" in tag.rsplit("/", 1)[-1] else (tag, "", "")
    api = connect(docker_host).api
    errors = docker_errors()
    try:
        api.ping()
    except errors.DockerException as exc:
        raise unavailable(exc, docker_host) from None
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="corral-image-") as tmp:
        out = Path(tmp) / "rootfs.tar"
        say(f"making a Debian {suite} root filesystem with {', '.join(BASE_PACKAGES)} "
            "(mmdebstrap)")
        proc = subprocess.Popen(rootfs_command(out, suite=suite), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace")
        assert proc.stdout is not None
        tail: list[str] = []
        for line in proc.stdout:
            line = line.rstrip()
            tail = (tail + [line])[-5:]
            step = mmdebstrap_step(line)
            if step is not None:
                say(step)
        if proc.wait() != 0:
            raise ConfigError("mmdebstrap failed: " + " | ".join(tail))
        size = out.stat().st_size
        say(f"importing {size / 1e6:.0f} MB into the Docker daemon as {tag}")
        try:
            api.import_image(src=str(out), repository=repo or tag, tag=version or None,
                             changes=[f"ENV {PATH_ENV}", "WORKDIR /workspace"])
            image_id: str = api.inspect_image(tag)["Id"]
        except errors.DockerException as exc:
            raise unavailable(exc, docker_host) from None
    say(f"built {tag} ({image_id[:19]}) in {time.monotonic() - start:.0f} s")
    return image_id
