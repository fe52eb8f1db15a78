"""Test helper: prove that no secret value reached anything corral wrote."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from corral.sandbox.leakscan import Finding, scan_paths

__all__ = ["assert_no_secrets", "find_secrets"]


def find_secrets(paths: Iterable[str | Path], secrets: Mapping[str, str]) -> list[Finding]:
    """Every file under ``paths`` holding a secret value or a common encoding of one."""
    return scan_paths([p for p in paths if Path(p).exists()], secrets)


def assert_no_secrets(paths: Iterable[str | Path], secrets: Mapping[str, str]) -> None:
    """Fail (AssertionError naming files and secret *names*) if any value is found."""
    paths = list(paths)
    assert any(Path(p).exists() for p in paths), f"nothing to scan among {paths}"
    hits = find_secrets(paths, secrets)
    assert not hits, "secret values found in: " + ", ".join(f"{h.path} ({h.secret})" for h in hits)
