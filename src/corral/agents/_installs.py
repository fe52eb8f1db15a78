"""Installed agent CLIs: ``corral agents install`` puts pinned npm packages here.

Layout: ``<root>/<name>/<version>/`` is an npm prefix (``node_modules/.bin/<bin>``) plus
``corral-install.json`` (written last: an install without it is incomplete and ignored).
``<root>`` is ``$CORRAL_AGENTS_DIR`` or ``$CORRAL_HOME/agents``. Sandboxes get ``<root>``
read-only at :data:`AGENTS_MOUNT`.

Installs are atomic: npm runs in a temporary directory next to the target, the CLI's
``--version`` is checked, and only then is the directory renamed into place.

Companions (:class:`~corral.harness._packages.Companion`: the Claude Code ACP adapter
beside Claude Code) get their own npm prefix ``<install>/<subdir>``, installed with the
CLI, or added to an existing install by the next ``corral agents install`` (atomically
too: a temporary directory inside the install, renamed to ``<subdir>``).

Running as root, isolated sandboxes run as an unprivileged host uid, which must be able to
reach the install (bubblewrap resolves bind sources with the sandbox's rights). When the
root directory is not reachable by other users (``~/.corral`` under a mode-0700 home), the
files go to ``/var/lib/corral/agents/installs/<name>/<version>``, one install per version
shared by every home (:mod:`corral.agents._shared`: reference files, ``corral agents
prune``), and the entry in ``<root>`` is a symlink to them. Where the shared directory
cannot be trusted, or for a root that already has installs of the older layout, they go to
``/var/lib/corral/agents/<digest of root>/<name>/<version>`` instead.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from corral._errors import ConfigError, CorralError, PrerequisiteMissing
from corral._paths import SHARED_ROOT, corral_home
from corral.agents import _shared
from corral.harness._packages import (
    AGENTS_MOUNT,
    KNOWN_AGENTS,
    AgentPackage,
    Companion,
    package_for,
)

__all__ = [
    "AGENTS_MOUNT",
    "KNOWN_AGENTS",
    "AgentPackage",
    "AgentStatus",
    "InstallError",
    "InstalledAgent",
    "agents_report",
    "agents_root",
    "check_version",
    "find_installed",
    "installed_at",
    "install_agent",
    "list_installed",
    "missing_companions",
    "mount_source",
    "package_for",
]

MARKER = "corral-install.json"
_VERSION_RE = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+(?:[-+][0-9A-Za-z.-]+)?$")


class InstallError(CorralError):
    """npm failed, or the installed CLI does not run (the message carries npm's output)."""


@dataclass(frozen=True, slots=True)
class InstalledAgent:
    """One complete install."""

    name: str
    version: str
    package: str
    path: Path
    """The real (symlink-resolved) npm prefix directory."""
    root: Path
    """The agents root it was found under."""
    installed_at: float

    @property
    def bin_path(self) -> Path:
        """The CLI's host path."""
        return self.path / "node_modules" / ".bin" / KNOWN_AGENTS[self.name].bin

    @property
    def rel_bin(self) -> str:
        """The CLI's path relative to the agents root (for :data:`AGENTS_MOUNT`)."""
        return f"{self.name}/{self.version}/node_modules/.bin/{KNOWN_AGENTS[self.name].bin}"

    @property
    def companions(self) -> tuple[Companion, ...]:
        """The companions present in this install."""
        return tuple(c for c in KNOWN_AGENTS[self.name].companions
                     if (self.path / c.rel_bin).exists())


def missing_companions(agent: InstalledAgent) -> tuple[Companion, ...]:
    """The companions ``agent``'s package should have beside it but does not."""
    have = set(agent.companions)
    return tuple(c for c in KNOWN_AGENTS[agent.name].companions if c not in have)


def agents_root() -> Path:
    """``$CORRAL_AGENTS_DIR`` or ``$CORRAL_HOME/agents`` (created on demand)."""
    raw = os.environ.get("CORRAL_AGENTS_DIR")
    root = Path(raw).expanduser() if raw else corral_home() / "agents"
    root.mkdir(parents=True, exist_ok=True, mode=0o755)
    return root


def check_version(version: str) -> str:
    """Return ``version`` if it is an exact npm version, else raise :class:`ConfigError`."""
    if not isinstance(version, str) or not _VERSION_RE.match(version):
        raise ConfigError(f"invalid version {version!r}: give an exact npm version like 1.2.3")
    return version


def others_can_reach(path: Path) -> bool:
    """Whether a user other than the owner can traverse every directory up to ``path``."""
    p = path.resolve()
    for d in [p, *p.parents]:
        try:
            st = d.stat()
        except OSError:
            return False
        if stat.S_ISDIR(st.st_mode) and not st.st_mode & stat.S_IXOTH:
            return False
    return True


def mount_source(root: Path) -> Path:
    """The host directory to bind at :data:`AGENTS_MOUNT` for agents root ``root``: the
    root itself, or its shared storage when the root is not reachable by the sandboxes'
    uid (see the module docstring)."""
    if os.geteuid() != 0 or others_can_reach(root):
        return root.resolve()
    if _shared.shared_for(root):
        return _shared.installs_dir()
    return _shared.legacy_dir(root)


def ensure_mount_source(root: Path) -> Path:
    """:func:`mount_source` for ``root``, created if missing (a sandbox may be made before
    any agent is installed, and bubblewrap cannot bind a path that does not exist)."""
    base = mount_source(root)
    if base != root.resolve() and base != _shared.installs_dir():
        for d in (SHARED_ROOT, SHARED_ROOT / "agents", base):
            d.mkdir(mode=0o755, exist_ok=True)
            os.chmod(d, 0o755)
    return base


def _storage_dir(root: Path, name: str, version: str) -> Path:
    """Where the files of ``name@version`` really go (see the module docstring)."""
    base = mount_source(root)
    if base == root.resolve():
        return root / name / version
    for d in (SHARED_ROOT, SHARED_ROOT / "agents", base, base / name):
        d.mkdir(mode=0o755, exist_ok=True)
        os.chmod(d, 0o755)
    return base / name / version


def _read_marker(entry: Path, root: Path) -> InstalledAgent | None:
    try:
        data = json.loads((entry / MARKER).read_text())
        agent = InstalledAgent(
            name=str(data["name"]),
            version=str(data["version"]),
            package=str(data["package"]),
            path=entry.resolve(),
            root=root,
            installed_at=float(data.get("installed_at", 0.0)),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if agent.name not in KNOWN_AGENTS or not agent.bin_path.exists():
        return None
    return agent


def list_installed(root: Path | None = None) -> list[InstalledAgent]:
    """Every complete install under the agents root, sorted by name then version."""
    root = root or agents_root()
    found: list[InstalledAgent] = []
    for name in sorted(KNOWN_AGENTS):
        d = root / name
        if not d.is_dir():
            continue
        for entry in sorted(d.iterdir()):
            if entry.name.startswith("."):
                continue
            agent = _read_marker(entry, root)
            if agent is not None and agent.name == name and agent.version == entry.name:
                found.append(agent)
    return found


def installed_at(name: str, version: str, *, root: Path | None = None
                 ) -> InstalledAgent | None:
    """The install of agent ``name`` at ``version``, if there is one (what a harness,
    which knows its package and version, runs)."""
    return next((a for a in list_installed(root) if a.name == name and a.version == version),
                None)


def find_installed(
    name: str, version: str | None = None, *, root: Path | None = None
) -> InstalledAgent | None:
    """The install to use: ``version`` if given, else the pinned version if installed,
    else the most recently installed version."""
    pkg = package_for(name, require_supported=False)
    mine = [a for a in list_installed(root) if a.name == name]
    want = version or pkg.version
    for a in mine:
        if a.version == want:
            return a
    if version is None and mine:
        return max(mine, key=lambda a: a.installed_at)
    return None


def _npm() -> str:
    npm = shutil.which("npm")
    if npm is None:
        raise PrerequisiteMissing(
            "npm is not installed: install Node.js and npm (e.g. `apt-get install nodejs npm`)"
        )
    return npm


def _chmod_tree(path: Path) -> None:
    """Readable (and traversable) by everyone: sandboxes run as another uid."""
    for dirpath, dirnames, filenames in os.walk(path):
        for d in dirnames:
            p = os.path.join(dirpath, d)
            if not os.path.islink(p):
                os.chmod(p, os.stat(p).st_mode | 0o555)
        for f in filenames:
            p = os.path.join(dirpath, f)
            if not os.path.islink(p):
                mode = os.stat(p).st_mode
                os.chmod(p, mode | 0o444 | (0o111 if mode & 0o100 else 0))
    os.chmod(path, os.stat(path).st_mode | 0o555)


def _npm_env() -> dict[str, str]:
    # corral's own key is no business of a package's install scripts
    env = {k: v for k, v in os.environ.items() if k != "CORRAL_SECRET"}
    env.update({"npm_config_update_notifier": "false", "npm_config_fund": "false",
                "npm_config_audit": "false"})
    return env


NPM_STAGES = ("resolving", "downloading", "installing", "linking")
"""npm's stages as ``install_agent`` reports them (``npm: <stage>``), always all, in order."""


def _npm_stage(line: str) -> int | None:
    """The index in :data:`NPM_STAGES` a line of npm's ``--loglevel=silly`` output starts,
    or ``None``: the ideal tree is resolving; tarballs fetched or read from the cache are
    downloading; install scripts are installing; the ``ADD`` lines npm logs once the tree
    is in place are linking."""
    if line.startswith("npm silly idealTree"):
        return 0
    if line.startswith(("npm silly reify", "npm silly tarball", "npm http cache")) or (
            line.startswith("npm http fetch") and ".tgz" in line):
        return 1
    if line.startswith("npm info run "):
        return 2
    if line.startswith("npm silly ADD "):
        return 3
    return None


def _npm_install(npm: str, prefix: Path, spec: str, env: dict[str, str], timeout: float,
                 *, omit_optional: bool = False,
                 progress: Callable[[str], None] | None = None) -> None:
    """``npm install spec`` into the prefix ``prefix`` (raises :class:`InstallError`).
    ``progress`` gets ``npm: <stage>`` for each of :data:`NPM_STAGES` as npm reaches it."""
    argv = [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
            "--save-exact", "--loglevel=silly" if progress else "--loglevel=error", spec]
    if omit_optional:
        argv.insert(2, "--omit=optional")
    say = progress or (lambda stage: None)
    reached = -1
    kept: list[str] = []  # what an error message shows: npm's lines but the chatter
    proc = subprocess.Popen(argv, cwd=str(prefix), env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            errors="replace")
    timed_out = threading.Event()

    def kill() -> None:
        timed_out.set()
        proc.kill()

    timer = threading.Timer(timeout, kill)
    timer.start()
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            stage = _npm_stage(line)
            while stage is not None and reached < stage:  # every stage, in order
                reached += 1
                say(f"npm: {NPM_STAGES[reached]}")
            if not line.startswith(("npm silly", "npm verbose", "npm http", "npm info",
                                    "npm timing")):
                kept = (kept + [line.rstrip()])[-40:]
        code = proc.wait()
    finally:
        timer.cancel()
        if proc.returncode is None:
            proc.kill()
            proc.wait()
    if timed_out.is_set():
        raise InstallError(f"npm install {spec} timed out after {timeout}s")
    if code != 0:
        tail = "\n".join(kept).strip()[-2000:]
        raise InstallError(f"npm install {spec} failed (exit {code}): {tail}")
    while progress and reached < len(NPM_STAGES) - 1:  # a tree npm had nothing to do for
        reached += 1
        say(f"npm: {NPM_STAGES[reached]}")


def _check_runs(binary: Path, package: str, version: str, env: dict[str, str]) -> None:
    """``binary --version`` must print ``version`` (raises :class:`InstallError`)."""
    try:
        check = subprocess.run([str(binary), "--version"], stdin=subprocess.DEVNULL,
                               capture_output=True, timeout=60, env=env, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InstallError(f"{package}@{version} installed but `{binary.name} --version` "
                           f"failed: {exc}") from exc
    out = check.stdout.decode("utf-8", "replace")
    if check.returncode != 0 or version not in out:
        err = check.stderr.decode("utf-8", "replace").strip()[-500:]
        raise InstallError(
            f"{package}@{version} installed but `{binary.name} --version` printed "
            f"{out.strip()!r} (exit {check.returncode}) {err}".strip()
        )


def _install_companion(npm: str, install_dir: Path, companion: Companion,
                       env: dict[str, str], timeout: float,
                       progress: Callable[[str], None] | None = None) -> None:
    """``companion`` into ``install_dir/<subdir>``: npm in a temporary directory beside
    it, checked, made readable by all, then renamed into place."""
    target = install_dir / companion.subdir
    tmp = install_dir / f".tmp-{companion.subdir}-{os.getpid()}-{time.monotonic_ns()}"
    tmp.mkdir(mode=0o755)
    if progress:
        progress(f"adding {companion.package} {companion.version}")
    try:
        _npm_install(npm, tmp, f"{companion.package}@{companion.version}", env, timeout,
                     omit_optional=companion.omit_optional)
        _check_runs(tmp / "node_modules" / ".bin" / companion.bin, companion.package,
                    companion.version, env)
        _chmod_tree(tmp)
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        os.rename(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def install_agent(
    name: str,
    version: str | None = None,
    *,
    root: Path | None = None,
    force: bool = False,
    timeout: float = 600.0,
    progress: Callable[[str], None] | None = None,
) -> InstalledAgent:
    """Install ``name`` (at ``version``, default the pinned one) with npm, atomically.

    Returns the existing install when it is already complete (unless ``force``). Raises
    :class:`ConfigError` for unknown/unsupported names or bad versions,
    :class:`PrerequisiteMissing` without npm and :class:`InstallError` when npm fails or
    the CLI does not run. ``progress`` gets the name of each stage as it starts (``npm:
    resolving``, … :data:`NPM_STAGES`, ``checking <bin> --version``, ``adding <companion>``).
    """
    pkg = package_for(name)
    version = check_version(version or pkg.version)
    root = root or agents_root()
    root.mkdir(parents=True, exist_ok=True, mode=0o755)
    shared = mount_source(root) == _shared.installs_dir()
    if shared and not force and _read_marker(_shared.installs_dir() / name / version,
                                             root) is not None:
        _link(root, name, version, _shared.installs_dir() / name / version)  # no npm
    existing = find_installed(name, version, root=root)
    if existing is not None and not force:
        for companion in missing_companions(existing):
            _install_companion(_npm(), existing.path, companion, _npm_env(), timeout,
                               progress)
        if shared and existing.path.parent.parent == _shared.installs_dir().resolve():
            _shared.add_ref(root, name, version)  # an install linked before refs existed
        return existing
    npm = _npm()
    entry = root / name / version
    real = _storage_dir(root, name, version)
    real.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    (root / name).mkdir(parents=True, exist_ok=True, mode=0o755)
    tmp = real.parent / f".tmp-{version}-{os.getpid()}-{time.monotonic_ns()}"
    tmp.mkdir(mode=0o755)
    try:
        env = _npm_env()
        _npm_install(npm, tmp, f"{pkg.package}@{version}", env, timeout, progress=progress)
        if progress:
            progress(f"checking {pkg.bin} --version")
        _check_runs(tmp / "node_modules" / ".bin" / pkg.bin, pkg.package, version, env)
        for companion in pkg.companions:
            _install_companion(npm, tmp, companion, env, timeout, progress)
        installed_at = time.time()
        (tmp / MARKER).write_text(json.dumps({
            "name": name, "package": pkg.package, "version": version,
            "installed_at": installed_at,
        }))
        _chmod_tree(tmp)
        _put_in_place(tmp, real, replace=force or not shared)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    if real != entry:
        _link(root, name, version, real) if shared else _symlink(entry, real)
    agent = _read_marker(entry, root)
    if agent is None:  # pragma: no cover - we just wrote it
        raise InstallError(f"install of {name} {version} at {entry} is incomplete")
    return agent


def _put_in_place(tmp: Path, real: Path, *, replace: bool) -> None:
    """Rename the finished install ``tmp`` to ``real``. A shared install that another home
    finished meanwhile is kept (``replace`` false: ``tmp`` is dropped); a replaced one is
    moved aside first and deleted after (the rename is what sandboxes see)."""
    old: Path | None = None
    if real.exists() or real.is_symlink():
        if not replace and _read_marker(real, real.parent) is not None:
            return
        if real.is_dir() and not real.is_symlink():
            old = real.parent / f".old-{real.name}-{os.getpid()}-{time.monotonic_ns()}"
            os.rename(real, old)
        else:
            real.unlink()
    try:
        os.rename(tmp, real)
    except OSError:
        if replace or _read_marker(real, real.parent) is None:
            raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _symlink(entry: Path, real: Path) -> None:
    if entry.is_symlink() or entry.is_file():
        entry.unlink()
    elif entry.is_dir():
        shutil.rmtree(entry)
    entry.symlink_to(real)


def _link(root: Path, name: str, version: str, real: Path) -> None:
    """``root``'s entry for ``name`` ``version`` points at the shared install ``real``, and
    the shared directory knows (under its lock, so a prune never sees half of it)."""
    (root / name).mkdir(parents=True, exist_ok=True, mode=0o755)
    with _shared.locked():
        _symlink(root / name / version, real)
        _shared.add_ref(root, name, version)


@dataclass(frozen=True, slots=True)
class AgentStatus:
    """One agent's line in ``corral doctor``."""

    name: str
    supported: bool
    pinned: str
    installed: tuple[str, ...]
    ok: bool
    message: str


def agents_report(root: Path | None = None) -> list[AgentStatus]:
    """What ``corral doctor`` shows about agent CLIs (never raises)."""
    try:
        root = root or agents_root()
        installed = list_installed(root)
    except (OSError, CorralError) as exc:
        return [AgentStatus("agents", False, "", (), False, f"cannot read agents dir: {exc}")]
    npm = shutil.which("npm")
    out: list[AgentStatus] = []
    for name, pkg in KNOWN_AGENTS.items():
        versions = tuple(a.version for a in installed if a.name == name)
        if not pkg.supported:
            out.append(AgentStatus(name, False, pkg.version, versions, True,
                                   "not yet supported by corral"))
            continue
        if versions:
            msg = f"installed {', '.join(versions)} under {root}"
            if pkg.version not in versions:
                msg += f" (tested version is {pkg.version})"
            use = next((a for a in installed if a.name == name and a.version == pkg.version),
                       next(a for a in installed if a.name == name))
            missing = missing_companions(use)
            for c in use.companions:
                msg += f"; with {c.package} {c.version}"
            if missing:
                msg += "; missing " + ", ".join(f"{c.package} {c.version}" for c in missing) \
                    + f": run `corral agents install {name}`"
            out.append(AgentStatus(name, True, pkg.version, versions, not missing, msg))
        else:
            fix = f"`corral agents install {name}`" if npm else "install Node.js/npm, then " \
                  f"`corral agents install {name}`"
            out.append(AgentStatus(name, True, pkg.version, versions, False,
                                   f"not installed: {fix}"))
    return out
