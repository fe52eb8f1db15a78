"""``corral images build`` names mmdebstrap's steps, never echoes a hook's script (issue #31,
item 10, part). mmdebstrap prints ``I: running --customize-hook in shell: sh -c '<the whole
script>'``; the script's later lines carry no ``I:`` prefix."""

from __future__ import annotations

from corral.providers._docker_image import mmdebstrap_step


def test_a_hook_is_named_not_echoed() -> None:
    lines = [
        "I: chroot architecture amd64 is equal to the host's architecture",
        "I: running --customize-hook in shell: sh -c 'set -e",
        "rm -rf \"$1\"/var/cache/apt/*",
        "echo done'",
        "I: running --setup-hook directly: /usr/share/mmdebstrap/hooks/x setup /tmp/r",
        "W: a warning",
    ]
    steps = [s for s in map(mmdebstrap_step, lines) if s is not None]
    assert steps == ["chroot architecture amd64 is equal to the host's architecture",
                     "running --customize-hook", "running --setup-hook"]
