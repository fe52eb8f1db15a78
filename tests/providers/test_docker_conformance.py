"""The provider kit against the docker provider (a real dockerd, corral's base image)."""

from __future__ import annotations


from corral.providers._docker import DockerProvider
from corral.testing import PROVIDER_KIT, pytest_checks
from tests.docker_support import need_docker  # noqa: F401 - a fixture, found by name

pytest_checks(PROVIDER_KIT, DockerProvider, globals(),
              usefixtures=["corral_home", "need_docker"])
