"""pytest plugin entry point for corral's test kits.

The kits themselves are plain functions (``corral.testing.check_store`` …) and
``corral.testing.pytest_checks`` turns one into a test per check. This plugin adds the shared
command-line option and the rule that a missing prerequisite is a *named* skip, which CI
turns into a failure (``--corral-no-skips`` or ``CI=true``).
"""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("corral")
    group.addoption(
        "--corral-no-skips",
        action="store_true",
        default=False,
        help="fail (instead of skip) when a conformance prerequisite is missing; on when CI=true",
    )


def no_skips(config: pytest.Config) -> bool:
    return bool(config.getoption("--corral-no-skips")) or os.environ.get("CI") == "true"


def require(config: pytest.Config, ok: bool, what: str, fix: str) -> None:
    """Skip with a named reason when ``ok`` is false, or fail when skips are not allowed."""
    if ok:
        return
    message = f"missing prerequisite: {what} (fix: {fix})"
    if no_skips(config):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)
