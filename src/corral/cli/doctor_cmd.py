"""``corral doctor``: check what this machine offers and print the fix for each gap."""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sqlite3
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import anyio


AGENTS = ("claude", "codex")


@dataclass
class Check:
    name: str
    status: str  # ok | warn | missing
    detail: str
    fix: str = ""
    required: bool = False


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("doctor", help="check prerequisites and print fixes")
    p.set_defaults(func=run)


def _which(name: str) -> str | None:
    return shutil.which(name)


def _bubblewrap() -> list[Check]:
    checks: list[Check] = []
    path = _which("bwrap")
    if path is None:
        return [Check("bubblewrap", "missing", "bwrap is not on PATH",
                      "apt-get install bubblewrap (or dnf/pacman install bubblewrap)", True)]
    userns = Path("/proc/sys/user/max_user_namespaces")
    if userns.exists() and userns.read_text().strip() == "0":
        checks.append(Check("user namespaces", "missing", "user.max_user_namespaces is 0",
                            "sysctl -w user.max_user_namespaces=15000", True))
    clone = Path("/proc/sys/kernel/unprivileged_userns_clone")
    if clone.exists() and clone.read_text().strip() == "0":
        checks.append(Check("user namespaces", "missing", "kernel.unprivileged_userns_clone is 0",
                            "sysctl -w kernel.unprivileged_userns_clone=1", True))
    apparmor = Path("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
    if apparmor.exists() and apparmor.read_text().strip() == "1":
        checks.append(Check("user namespaces", "warn", "AppArmor restricts unprivileged user namespaces",
                            "add an AppArmor profile for bwrap or sysctl "
                            "kernel.apparmor_restrict_unprivileged_userns=0"))
    # The real thing: create a sandbox, run a command in it, destroy it.
    try:
        detail = anyio.run(_try_sandbox)
        checks.append(Check("bubblewrap", "ok", f"{path}: {detail}"))
    except Exception as exc:  # noqa: BLE001 - every failure is reported, none raised
        checks.append(Check("bubblewrap", "missing", f"a test sandbox failed: {exc}",
                            "check user namespaces (above) and that bwrap runs: "
                            "bwrap --unshare-all --unshare-user --ro-bind / / true", True))
    return checks


async def _try_sandbox() -> str:
    from corral.providers.bubblewrap import BubblewrapProvider

    with tempfile.TemporaryDirectory(prefix="corral-doctor-") as tmp:
        provider = BubblewrapProvider(home=tmp)
        handle = await provider.create()
        try:
            r = await handle.process.exec(["id", "-u"], timeout=30)
            if not r.ok or r.stdout.strip() != b"1000":
                raise RuntimeError(f"test command failed: {r.describe()}: {r.stderr[-300:]!r}")
            net = await handle.process.exec(["cat", "/proc/net/dev"], timeout=30)
            if b"eth" in net.stdout or b"ens" in net.stdout:
                raise RuntimeError("the test sandbox can see host network interfaces")
            mode = handle.state.limit_mode
        finally:
            await provider.destroy(handle.ref)
    limits = {"cgroup": "limits via cgroups", "rlimit": "limits via rlimits only",
              "none": "no resource limits"}[mode]
    return f"a test sandbox ran as an unprivileged user without network; {limits}"


def _cgroups() -> Check:
    from corral.providers import cgroups

    if os.geteuid() != 0:
        return Check("cgroups", "warn", "not root: limits fall back to rlimits (per process)",
                     "run corral as root, or accept weaker limits")
    ok, why = cgroups.available()
    if ok:
        return Check("cgroups", "ok", why)
    return Check("cgroups", "warn", f"{why}; limits fall back to rlimits (per process)",
                 "mount cgroup v1 memory,pids,cpu,freezer hierarchies (cgroup v2 is not supported yet)")


def _tool(name: str, why: str, fix: str, required: bool = False) -> Check:
    path = _which(name)
    if path:
        return Check(name, "ok", path)
    return Check(name, "missing" if required else "warn", f"not found ({why})", fix, required)


def _docker() -> Check:
    path = _which("docker")
    if not path:
        return Check("docker", "warn", "not installed (docker provider unavailable)",
                     "install Docker Engine")
    try:
        r = subprocess.run([path, "info", "--format", "{{.ServerVersion}}"], capture_output=True,
                           text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("docker", "warn", f"{path}: cannot run: {exc}", "start the Docker daemon")
    if r.returncode != 0:
        return Check("docker", "warn", f"{path}: daemon not reachable", "start the Docker daemon "
                     "(systemctl start docker) or set DOCKER_HOST")
    return Check("docker", "ok", f"{path}: engine {r.stdout.strip()}")


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def _stores() -> list[Check]:
    checks = [Check("sqlite", "ok", f"SQLite {sqlite3.sqlite_version} (default store)")]
    for name, port, env in (("postgres", 5432, "CORRAL_POSTGRES_URL"), ("redis", 6379, "CORRAL_REDIS_URL")):
        if _reachable("127.0.0.1", port):
            checks.append(Check(name, "ok", f"reachable on 127.0.0.1:{port} (optional store)"))
        else:
            checks.append(Check(name, "warn", f"not reachable on 127.0.0.1:{port} (optional store)",
                                f"start {name} or point {env} at one, if you want a shared store"))
    return checks


def _agents() -> list[Check]:
    """The agent CLIs corral manages (pinned npm versions under the agents root)."""
    from corral.harness.installs import agents_report

    out = []
    for status in agents_report():
        if not status.supported:
            continue
        if status.ok:
            out.append(Check(f"agent {status.name}", "ok", status.message))
        else:
            out.append(Check(f"agent {status.name}", "warn", "not installed",
                             f"corral agents install {status.name}"))
    return out


def collect() -> list[Check]:
    checks = _bubblewrap()
    checks.append(_cgroups())
    checks.append(_tool("perl", "used to report which signal killed a command",
                        "apt-get install perl-base"))
    if os.geteuid() == 0:
        checks.append(_tool("setpriv", "drops sandboxes to an unprivileged uid when run as root",
                            "apt-get install util-linux", required=True))
    checks.append(_tool("git", "workspaces from git repositories", "apt-get install git"))
    checks.append(_docker())
    checks.append(_tool("socat", "bridges unix sockets for host tools", "apt-get install socat"))
    checks += _stores()
    checks += _agents()
    checks.append(Check("local provider", "warn",
                        "gives NO isolation: commands run on the host as you, with your files "
                        "and network; use it only for trusted commands",
                        "use the bubblewrap provider (the default) for anything untrusted"))
    return checks


def run(args: argparse.Namespace) -> int:
    checks = collect()
    width = max(len(c.name) for c in checks)
    for c in checks:
        label = {"ok": " ok ", "warn": "warn", "missing": "MISS"}[c.status]
        print(f"[{label}] {c.name:<{width}}  {c.detail}")
        if c.fix and c.status != "ok":
            print(f"       {'':<{width}}  fix: {c.fix}")
    failed = [c for c in checks if c.required and c.status == "missing"]
    if failed:
        print(f"\ncorral cannot run isolated sandboxes here: fix {', '.join(c.name for c in failed)}")
        return 1
    print("\nready: isolated sandboxes work (bubblewrap)")
    return 0
