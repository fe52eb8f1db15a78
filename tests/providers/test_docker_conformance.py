"""The provider kit against the docker provider (a real dockerd, corral's base image)."""

from __future__ import annotations


from corral.providers._docker import DockerProvider
from corral.testing import PROVIDER_KIT, pytest_checks

pytest_checks(PROVIDER_KIT, DockerProvider, globals(),
              usefixtures=["corral_home", "need_docker"])
