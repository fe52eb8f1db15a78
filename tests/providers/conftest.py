"""Fixtures for the provider tests: a private $CORRAL_HOME and prerequisite checks."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from corral.testing._plugin import require


def bwrap_works() -> bool:
    if shutil.which("bwrap") is None:
        return False
    out = subprocess.run(
        ["bwrap", "--unshare-all", "--unshare-user", "--ro-bind", "/", "/", "true"],
        capture_output=True,
        check=False,
    )
    return out.returncode == 0


@pytest.fixture
def need_bwrap(request: pytest.FixtureRequest) -> None:
    require(
        request.config,
        bwrap_works(),
        "bubblewrap with user namespaces",
        "apt-get install bubblewrap; sysctl kernel.unprivileged_userns_clone=1",
    )
