"""``corral doctor``: check what this machine offers and print the fix for each gap."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import anyio

from corral._errors import CorralError
from corral.agents._installs import agents_report
from corral.providers import _cgroups as cgroups
from corral.providers import _diskquota as diskquota
from corral.providers._bubblewrap import DEFAULT_LIMITS, FILES_ROOT, BubblewrapProvider
from corral.providers._bwrap_init import find_init
from corral.stores import default_store_url, open_store
from corral.stores._protocols import Diagnosable

__all__ = ["Check", "collect", "run"]

AGENTS = ("claude", "codex")


@dataclass
class Check:
    name: str
    status: str  # ok | warn | missing
    detail: str
    fix: str = ""
    required: bool = False


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
        detail, (how, why) = anyio.run(_try_sandbox)
        checks.append(Check("bubblewrap", "ok", f"{path}: {detail}"))
        # How the test sandbox's commands started: through its agent, or (the fallback) a
        # launcher chain and bwrap per command, and why.
        if how == "agent":
            checks.append(Check("sandbox commands", "ok", f"through the sandbox's agent: {why}"))
        else:
            checks.append(Check("sandbox commands", "warn",
                                f"a launcher chain per command (~7 ms each): {why}",
                                "apt-get install gcc, then run corral doctor again"))
    except Exception as exc:  # noqa: BLE001 - every failure is reported, none raised
        checks.append(Check("bubblewrap", "missing", f"a test sandbox failed: {exc}",
                            "check user namespaces (above) and that bwrap runs: "
                            "bwrap --unshare-all --unshare-user --ro-bind / / true", True))
    return checks


async def _try_sandbox() -> tuple[str, tuple[str, str]]:
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
            disk = "a disk quota" if handle.state.disk_fsid else "no disk quota"
            path = provider.command_path()
        finally:
            await provider.destroy(handle.ref)
    limits = {"cgroup": "limits via cgroups", "rlimit": "limits via rlimits only",
              "none": "no resource limits"}[mode]
    return (f"a test sandbox ran as an unprivileged user without network; {limits}; {disk}",
            path)


def _cgroups() -> Check:
    if os.geteuid() != 0:
        return Check("cgroups", "warn", "not root: limits fall back to rlimits (per process)",
                     "run corral as root, or accept weaker limits")
    ok, why = cgroups.available()
    if ok:
        return Check("cgroups", "ok", why)
    return Check("cgroups", "warn", f"{why}; limits fall back to rlimits (per process)",
                 "mount cgroup v1 memory,pids,cpu,freezer hierarchies (cgroup v2 is not supported yet)")


def _cgroup_migrations(mounts: str | None, *, in_group: str | None) -> Check | None:
    """Whether moving a command into its sandbox's cgroup is quick. Without the cgroup2
    mount option ``favordynmods`` (Linux 6.1+) the kernel waits for an RCU grace period
    (~10 ms here) before a move that follows an idle moment (docs/benchmarks.md,
    bench/exec_after_idle.py). ``in_group`` is None when local commands are started inside
    their group (no move), else why they are not: then every local command after a pause
    pays the wait; otherwise only the fallback paths do."""
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text()
        except OSError:
            return None
    v2 = [fields for fields in (line.split() for line in mounts.splitlines())
          if len(fields) >= 4 and fields[2] == "cgroup2"]
    if not v2:
        return None
    slow = [f[1] for f in v2 if "favordynmods" not in f[3].split(",")]
    if not slow:
        return Check("cgroup moves", "ok", "cgroup2 is mounted with favordynmods")
    fix = (f"mount -o remount,favordynmods {slow[0]}  (host-wide, Linux 6.1+; makes "
           "fork and exit slightly slower); add it to the mount's options to keep it")
    if in_group is None:
        return Check("cgroup moves", "ok",
                     "local commands start inside their sandbox's cgroup (no move); only the "
                     "fallback paths move one (bubblewrap without its agent, a local agent "
                     "run's start), and those wait ~10 ms after an idle moment", fix)
    return Check("cgroup moves", "warn",
                 "cgroup2 is mounted without favordynmods and local commands are moved into "
                 f"their sandbox's cgroup ({in_group}): a command started after an idle "
                 "moment waits ~10 ms for the move",
                 f"{fix}; or apt-get install gcc (local commands are then started inside "
                 "their group)")


def _in_group_spawner() -> str | None:
    """None when local commands start inside their cgroup, else why not."""
    from corral.providers import _cgspawn  # builds the helper on first use: doctor only

    return None if _cgspawn.spawner() is not None else _cgspawn.reason()


def _disk_quota() -> Check:
    """Which disk-quota mode bubblewrap sandboxes get here (sets up the pool if it can)."""
    default = diskquota.format_size(DEFAULT_LIMITS.disk_bytes or 0)
    if os.geteuid() != 0:
        return Check("disk quota", "warn", "not root: sandboxes have no disk quota (a sandbox "
                     "can fill the disk); asking for a disk limit is an error",
                     "run corral as root (with btrfs-progs installed)")
    try:
        FILES_ROOT.mkdir(parents=True, mode=0o711, exist_ok=True)
        pool = diskquota.pool(FILES_ROOT)
    except (diskquota.PoolUnavailable, OSError) as exc:
        fix = ("apt-get install btrfs-progs" if "mkfs.btrfs" in str(exc) else diskquota.FIX)
        return Check("disk quota", "warn", f"no disk quota for sandboxes ({exc}): a sandbox can "
                     "fill the disk; asking for a disk limit is an error", fix)
    st = os.statvfs(pool.root)
    return Check("disk quota", "ok", f"btrfs pool at {pool.root} "
                 f"({diskquota.format_size(st.f_blocks * st.f_frsize // (1 << 30) << 30)}, "
                 f"sparse): each sandbox is a subvolume limited to {default} by default")


def _sandbox_init() -> Check:
    """Which program is the bubblewrap sandboxes' pid 1 (it decides the exit status out of
    the command's reach): the compiled C init, or the slower perl one, and why."""
    found = find_init()
    if found.kind == "c":
        return Check("sandbox init", "ok", found.reason)
    if _which("perl"):
        return Check("sandbox init", "warn", f"perl (about 3 ms more per command): {found.reason}",
                     "apt-get install gcc, then run corral doctor again")
    return Check("sandbox init", "missing", f"neither a C compiler nor perl: {found.reason}",
                 "apt-get install gcc (or perl-base)", True)


def _tool(name: str, why: str, fix: str, required: bool = False) -> Check:
    path = _which(name)
    if path:
        return Check(name, "ok", path)
    return Check(name, "missing" if required else "warn", f"not found ({why})", fix, required)


def _store(url: str | None) -> Check:
    """Open the configured store (``--store``, ``$CORRAL_STORE`` or the SQLite default) and
    let it check itself: reachable, schema version, notifications."""
    shown = url or default_store_url()

    async def look() -> str:
        store = await open_store(url)
        try:
            if isinstance(store, Diagnosable):
                return await store.diagnose()
            return "opened"
        finally:
            with anyio.CancelScope(shield=True):
                await store.aclose()

    try:
        return Check("store", "ok", anyio.run(look))
    except CorralError as exc:
        return Check("store", "missing", str(exc),
                     "fix the URL (--store or CORRAL_STORE) or start the database it names",
                     True)
    except Exception as exc:  # noqa: BLE001 - every failure is reported, none raised
        return Check("store", "missing", f"{shown}: {type(exc).__name__}: {exc}",
                     "fix the URL (--store or CORRAL_STORE) or start the database it names",
                     True)


def _python_in_sandbox() -> Check:
    # Agent runs start the in-sandbox entry (forwarders) and the command gate with the
    # system Python the sandbox sees through its read-only /usr.
    if os.path.exists("/usr/bin/python3"):
        return Check("python3", "ok", "/usr/bin/python3 (agent runs: in-sandbox entry and "
                     "command gate)")
    return Check("python3", "warn", "/usr/bin/python3 not found (agent CLI runs need it "
                 "inside the sandbox)", "apt-get install python3")


def _agents() -> list[Check]:
    """The agent CLIs corral manages (pinned npm versions under the agents root)."""
    out = []
    for status in agents_report():
        if not status.supported:
            continue
        if status.ok:
            out.append(Check(f"agent {status.name}", "ok", status.message))
        elif status.installed:  # installed, but a companion (ACP adapter) is missing
            out.append(Check(f"agent {status.name}", "warn", status.message,
                             f"corral agents install {status.name}"))
        else:
            out.append(Check(f"agent {status.name}", "warn", "not installed",
                             f"corral agents install {status.name}"))
    return out


def _docker() -> list[Check]:
    """The docker provider (optional): the SDK, a daemon that answers, corral's image."""
    try:
        from corral.providers._docker_client import BASE_IMAGE, connect, docker_errors

        docker_errors()
    except Exception as exc:  # noqa: BLE001 - reported
        return [Check("docker", "warn", f"the docker provider is unavailable: {exc}",
                      "pip install 'corral[docker]'")]
    try:
        api = connect().api
        version = api.version().get("Version", "?")
    except Exception as exc:  # noqa: BLE001 - reported
        first = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        return [Check("docker", "warn", f"no Docker daemon answers ({first})",
                      "start dockerd (or set DOCKER_HOST) to use --provider docker")]
    runtimes = sorted(api.info().get("Runtimes") or {})
    checks = [Check("docker", "ok", f"daemon {version}, runtimes: {', '.join(runtimes)}")]
    if "runsc" in runtimes:
        checks.append(Check("docker gVisor", "ok", "the runsc runtime is available: "
                            "[provider] runtime = \"runsc\" runs sandboxes under gVisor"))
    else:
        checks.append(Check("docker gVisor", "warn", "the runsc runtime is not available on "
                            "this daemon: containers share the host's kernel",
                            "install gVisor (runsc) and register it with dockerd, then "
                            "[provider] runtime = \"runsc\""))
    try:
        api.inspect_image(BASE_IMAGE)
        checks.append(Check("docker image", "ok", f"{BASE_IMAGE} is built"))
    except Exception:  # noqa: BLE001 - reported
        checks.append(Check("docker image", "warn", f"{BASE_IMAGE} is not built",
                            "corral images build (needs mmdebstrap; or set [provider] image)"))
        return checks
    checks.append(_docker_commands())
    return checks


def _docker_commands() -> Check:
    """How a test container's commands run: through its agent (one exec stream per
    sandbox), or (the fallback) a ``docker exec`` each, and why."""
    async def try_it() -> tuple[str, str]:
        from corral.providers._docker import DockerProvider

        provider = DockerProvider()
        handle = await provider.create()
        try:
            r = await handle.process.exec(["true"])
            if not r.ok:
                raise RuntimeError(f"`true` failed in the test container: {r.describe()}")
            return provider.command_path()
        finally:
            await provider.destroy(handle.ref)

    try:
        how, why = anyio.run(try_it)
    except Exception as exc:  # noqa: BLE001 - every failure is reported, none raised
        return Check("docker commands", "warn", f"a test container failed: {exc}",
                     "check that `docker run --rm corral-base:<version> true` works")
    if how == "agent":
        return Check("docker commands", "ok", f"through the sandbox's agent: {why}")
    return Check("docker commands", "warn", f"a docker exec per command (tens of ms each): {why}",
                 "apt-get install gcc (the agent is compiled on the host), then run corral "
                 "doctor again")


def collect(store_url: str | None = None) -> list[Check]:
    checks = _bubblewrap()
    checks.append(_cgroups())
    if (moves := _cgroup_migrations(None, in_group=_in_group_spawner())) is not None:
        checks.append(moves)
    checks.append(_disk_quota())
    checks.append(_sandbox_init())
    if os.geteuid() == 0:
        checks.append(_tool("setpriv", "drops sandboxes to an unprivileged uid when run as root",
                            "apt-get install util-linux", required=True))
    checks.append(_tool("git", "workspaces from git repositories", "apt-get install git"))
    checks.append(_store(store_url))
    checks.append(_python_in_sandbox())
    checks.append(_tool("npm", "corral agents install fetches the agent CLIs from npm",
                        "apt-get install npm"))
    checks.append(_tool("node", "Codex's launcher and gemini-cli run on Node.js", "apt-get install nodejs"))
    checks += _agents()
    checks += _docker()
    checks.append(Check("local provider", "warn",
                        "gives NO isolation: commands run on the host as you, with your files "
                        "and network; use it only for trusted commands",
                        "use the bubblewrap provider (the default) for anything untrusted"))
    return checks


# What corral does not have yet, said once (never offered as a check that passes). Keep it
# true: tests/providers/test_cli.py checks that no registered harness is named here.
NOT_IN_THIS_VERSION: tuple[str, ...] = ("the Kubernetes provider", "the Redis store")


def run(args: argparse.Namespace) -> int:
    checks = collect(getattr(args, "store", None))
    failed = [c for c in checks if c.required and c.status == "missing"]
    if getattr(args, "json", False):
        import dataclasses
        import json

        print(json.dumps({"checks": [dataclasses.asdict(c) for c in checks],
                          "not_in_this_version": list(NOT_IN_THIS_VERSION),
                          "ready": not failed}))
        return 1 if failed else 0
    width = max(len(c.name) for c in checks)
    for c in checks:
        label = {"ok": " ok ", "warn": "warn", "missing": "MISS"}[c.status]
        print(f"[{label}] {c.name:<{width}}  {c.detail}")
        if c.fix and c.status != "ok":
            print(f"       {'':<{width}}  fix: {c.fix}")
    print(f"not in this version: {', '.join(NOT_IN_THIS_VERSION)}")
    if failed:
        print(f"\ncorral cannot run isolated sandboxes here: fix {', '.join(c.name for c in failed)}")
        return 1
    print("\nready: isolated sandboxes work (bubblewrap)")
    return 0
