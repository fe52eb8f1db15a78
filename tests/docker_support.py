"""The docker provider's test prerequisites: a daemon that answers and corral's base image
(built once when missing: ``scripts/test.sh`` builds it before the tests, cached)."""

from __future__ import annotations

import functools

import pytest

from corral.testing._plugin import require

FIX = ("scripts/test.sh installs docker.io, starts dockerd and builds the image; by hand: "
       "dockerd & then `corral images build`")


@functools.cache
def docker_problem() -> str | None:
    """Why the docker tests cannot run here, or ``None``."""
    try:
        import docker
    except ImportError:
        return "the Docker SDK (pip install 'corral[docker]')"
    try:
        docker.from_env(timeout=10).api.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means no daemon
        return f"a Docker daemon that answers ({str(exc).splitlines()[0][:120]})"
    from corral.providers._docker_image import build_base_image, image_exists

    if not image_exists():
        try:
            build_base_image()
        except Exception as exc:  # noqa: BLE001 - named in the skip
            return f"corral's base image ({exc})"
    return None


@pytest.fixture
def need_docker(request: pytest.FixtureRequest) -> None:
    problem = docker_problem()
    require(request.config, problem is None, problem or "", FIX)
