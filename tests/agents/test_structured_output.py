"""Structured output (``corral run --output-schema FILE``) for every agent harness: the
real npm CLI in bubblewrap against the scripted model server (the cases of the harness
kit). One test per check and harness: a valid object, recovery from a first invalid
answer, and a run whose every answer is invalid ending ``failed``."""

from __future__ import annotations

import pytest

from corral.testing import pytest_checks
from corral.testing._harness_output import OUTPUT_KIT

from .test_harness_kit import CASES, installed  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.timeout(400)]

pytest_checks(OUTPUT_KIT, CASES, globals(), usefixtures=("installed", "bwrap"))
