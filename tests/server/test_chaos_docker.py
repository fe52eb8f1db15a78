"""The three-server chaos test with docker as the provider (smaller; in the serial pass
with the other docker tests, see scripts/test.sh)."""

from __future__ import annotations

from pathlib import Path

from tests.server.test_chaos import chaos


def test_three_servers_on_postgres_survive_kills_on_docker(
        tmp_path: Path, need_bwrap_runs: None, need_docker: None) -> None:
    chaos("docker", tmp_path)
