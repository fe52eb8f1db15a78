"""Fixtures for the security tests: the agent-CLI fixtures of ``tests/agents`` (real CLIs
from npm, bubblewrap, the scripted model server) are shared here, and ``target``: the
provider an attack runs against, each isolating provider in turn."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers import agent_resident, idle_spare

from tests.agents.conftest import (  # noqa: F401 - fixtures, found by pytest by name
    agent_installs,
    agents_env,
    bwrap,
    model_server,
)

ISOLATING = ["bubblewrap", "docker"]
"""The providers an attack on the sandbox boundary runs against."""


@dataclass(frozen=True)
class Target:
    """One isolating provider, driven through the real CLI (``python -m corral``)."""

    provider: str
    corral: list[str]
    env: dict[str, str]
    home: Path
    stores: list[dict[str, str]] = field(default_factory=list)
    """Environments naming other stores whose runs' sandboxes the test made (its own
    ``env`` is always cleaned up)."""

    def argv(self, sub: str, *args: str) -> list[str]:
        """``corral SUB --provider P ARGS``."""
        return [*self.corral, sub, "--provider", self.provider, *args]

    def rm(self, name: str) -> None:
        """Destroy the kept sandbox ``name``."""
        subprocess.run([*self.corral, "sandboxes", "rm", "--provider", self.provider, name],
                       env=self.env, capture_output=True, timeout=120, check=False)

    def destroy_run_sandboxes(self) -> None:
        """Destroy the docker sandboxes of this test's runs (containers outlive the test's
        ``$CORRAL_HOME``; other tests and worktrees share the daemon: only these go)."""
        if self.provider != "docker":
            return  # the session's own finalizer destroys bubblewrap sandboxes
        from corral.providers._docker import DockerProvider

        provider = DockerProvider()
        for env in (self.env, *self.stores):
            r = subprocess.run([*self.corral, "ls", "--json", "--limit", "1000"], env=env,
                               capture_output=True, timeout=120, check=False)
            try:
                records = json.loads(r.stdout) if r.returncode == 0 else []
            except ValueError:
                records = []
            for record in records:
                ref = record.get("sandbox_ref") or {}
                if ref.get("provider") == "docker" and ref.get("id"):
                    provider._remove(str(ref["id"]))

    def sandbox_name(self, stem: str) -> str:
        """A name no other test (or worktree sharing the daemon) uses."""
        return f"{stem}-{os.getpid()}-{secrets.token_hex(3)}"

    def processes_left(self, name: str) -> list[str]:
        """The processes still running in the kept sandbox ``name`` (its init, and on
        bubblewrap its agent, aside)."""
        if self.provider == "docker":
            from corral.providers._docker import DockerProvider, container_name

            top = DockerProvider().api.top(container_name(name), ps_args="-eo pid,args")
            return [p[-1] for p in top["Processes"]
                    if "sleep 1000" in p[-1] or "python" in p[-1]]
        state = json.loads((self.home / "sandboxes" / "bubblewrap" / name / "state.json")
                           .read_text())
        # the sandbox's agent and its bwrap, and the agent's idle spare
        resident = agent_resident(state["cgroups"]) | idle_spare(state["cgroups"])
        return [pid for cg in state["cgroups"]
                for pid in Path(cg, "cgroup.procs").read_text().split()
                if int(pid) not in resident]


@pytest.fixture(params=ISOLATING)
def target(request: pytest.FixtureRequest, cli_env: dict[str, str], corral_cmd: list[str],
           corral_home: Path) -> Iterator[Target]:
    """Each isolating provider in turn; docker is a named skip only without a daemon (CI
    has one, and fails on skips). The sandboxes of the test's runs are destroyed after it."""
    request.getfixturevalue("need_docker" if request.param == "docker" else "need_bwrap_runs")
    t = Target(request.param, corral_cmd, cli_env, corral_home)
    try:
        yield t
    finally:
        t.destroy_run_sandboxes()
