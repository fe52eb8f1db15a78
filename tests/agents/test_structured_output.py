"""Structured output (``corral run --output-schema FILE``) for every agent harness: the
real npm CLI in bubblewrap against the scripted model server (the cases of the harness
kit). One test per check and harness: a valid object, recovery from a first invalid
answer, and a run whose every answer is invalid ending ``failed``."""

from __future__ import annotations

import anyio
import pytest

from corral.testing import pytest_checks
from corral.testing._harness_output import OUTPUT_KIT

from .test_harness_kit import CASES, installed  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.timeout(400)]

pytest_checks(OUTPUT_KIT, CASES, globals(), usefixtures=("installed", "bwrap"))


@pytest.mark.usefixtures("installed", "bwrap")
@pytest.mark.parametrize("case", ["opencode", "acp-opencode"])
def test_output_retries_survive_a_takeover(case: str) -> None:
    """A real takeover (SIGKILL of the driver, then ``corral attach``) continues the run's
    count of invalid results: :func:`check_output_retries_survive_a_takeover`."""
    from corral.testing._harness_output import check_output_retries_survive_a_takeover
    from corral.testing._harness_world import world

    async def main() -> None:
        async with world(CASES[case]) as w:
            await check_output_retries_survive_a_takeover(w)

    anyio.run(main)
