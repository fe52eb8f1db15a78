"""A sandbox cannot fill the host's disk (bubblewrap, as root).

The attack: a sandbox with a 64 MiB disk limit writes five times that, as one big file and
as many small ones, and tries to escape the quota through a btrfs subvolume of its own.
The writes must fail inside the sandbox (EDQUOT), corral must name the limit, the host's
free space must not drop by much more than the limit, a neighbour sandbox must not notice,
and destroying the sandbox must give the space back. Where the quota cannot be enforced
(not root, no mkfs.btrfs), a sandbox that asks for one is refused in one line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from corral._errors import ConfigError
from corral.providers import _diskquota as diskquota
from corral.providers._bubblewrap import FILES_ROOT, BubblewrapProvider
from corral.sandbox._contracts import ResourceLimits, SandboxSpec
from corral.testing import wait_until_async
from corral.testing._plugin import require

pytestmark = pytest.mark.usefixtures("need_bwrap_runs")

LIMIT = 64 << 20
ATTACK_MIB = 5 * LIMIT >> 20
# Room for btrfs metadata and for whatever else writes to the shared host disk meanwhile;
# without the quota the attack takes 5x the limit.
SLACK = 96 << 20
SRC = Path(__file__).resolve().parents[2] / "src"

WRITERS = {
    "one big file": f"dd if=/dev/zero of=/workspace/big bs=1M count={ATTACK_MIB}",
    "many small files": (
        f"i=0; while [ $i -lt {ATTACK_MIB * 4} ]; do "
        "head -c 262144 /dev/zero > /tmp/f$i || exit 1; i=$((i+1)); done"
    ),
}

# Creates a btrfs subvolume in the workspace (whose quota group would be its own, with no
# limit), then fills it.
ESCAPE = textwrap.dedent("""
    import fcntl, os, sys
    buf = bytearray(4096); buf[8:11] = b"esc"
    try:
        fcntl.ioctl(os.open("/workspace", os.O_RDONLY), 0x5000940E, buf)  # SUBVOL_CREATE
    except OSError as e:
        sys.exit(f"subvolume refused: {e}")
    os.execvp("dd", ["dd", "if=/dev/zero", "of=/workspace/esc/big", "bs=1M", "count=%d"])
""") % ATTACK_MIB


@pytest.fixture
def pool(request: pytest.FixtureRequest) -> diskquota.Pool:
    require(request.config, os.geteuid() == 0, "root (the disk quota needs it)",
            "run the tests as root")
    FILES_ROOT.mkdir(parents=True, mode=0o711, exist_ok=True)
    try:
        return diskquota.pool(FILES_ROOT)
    except diskquota.PoolUnavailable as exc:
        require(request.config, False, f"the btrfs pool for disk quotas ({exc})",
                "apt-get install btrfs-progs")
        raise


def pool_allocated(p: diskquota.Pool) -> int:
    """Bytes of the host's disk the pool's image file takes (it is sparse)."""
    os.sync()
    return (FILES_ROOT / diskquota.IMAGE).stat().st_blocks * 512


def host_free() -> int:
    os.sync()  # what btrfs holds in memory reaches its image file, and the host's disk
    st = os.statvfs(FILES_ROOT)
    return st.f_bavail * st.f_frsize


@pytest.mark.parametrize("how", sorted(WRITERS))
def test_writing_past_the_disk_limit_fails_and_is_named(
    how: str, pool: diskquota.Pool, corral_home: Path
) -> None:
    async def go() -> None:
        provider = BubblewrapProvider()
        spec = SandboxSpec(limits=ResourceLimits(disk_bytes=LIMIT))
        victim = await provider.create(spec)
        neighbour = await provider.create(spec)
        try:
            before = host_free()
            r = await victim.process.exec(["sh", "-c", WRITERS[how]], timeout=300)
            used = before - host_free()
            full = pool_allocated(pool)
            assert not r.ok, r
            assert b"Disk quota exceeded" in r.stderr or b"No space left" in r.stderr, r.stderr
            assert r.limit_hit == "disk", r
            assert r.describe() == f"exit code {r.exit_code} (the sandbox's disk limit was reached)"
            assert used < LIMIT + SLACK, f"the host lost {used >> 20} MiB"

            n = await neighbour.process.exec(
                "dd if=/dev/zero of=/workspace/f bs=1M count=32 && rm /workspace/f", timeout=60
            )
            assert n.ok and n.limit_hit is None, n
        finally:
            await provider.destroy(victim.ref)
            await provider.destroy(neighbour.ref)
        assert not Path(victim.state.files_dir).exists()
        # The pool hands freed blocks back to the host (discard punches holes in its image).
        await wait_until_async(lambda: pool_allocated(pool) < full - LIMIT // 2,
                               "destroy gave the sandbox's space back to the host",
                               timeout=120, interval=0.2)

    anyio.run(go)


def test_a_subvolume_made_inside_cannot_escape_the_limit(
    pool: diskquota.Pool, corral_home: Path
) -> None:
    async def go() -> None:
        provider = BubblewrapProvider()
        h = await provider.create(SandboxSpec(limits=ResourceLimits(disk_bytes=LIMIT)))
        try:
            r = await h.process.exec(["/usr/bin/python3", "-c", ESCAPE], timeout=300)
            assert not r.ok, r
            assert b"subvolume refused" in r.stderr, r.stderr
            assert not (Path(h.state.files_dir) / "root" / "workspace" / "esc").exists()
        finally:
            await provider.destroy(h.ref)

    anyio.run(go)


def test_cli_disk_option(
    pool: diskquota.Pool, corral_cmd: list[str], cli_env: dict[str, str]
) -> None:
    r = subprocess.run(
        [*corral_cmd, "exec", "--disk", "64M", "--", "sh", "-c", WRITERS["one big file"]],
        env=cli_env, capture_output=True, timeout=300, check=False,
    )
    assert r.returncode == 1, r.stderr
    err = r.stderr.decode()
    assert "Disk quota exceeded" in err
    assert err.rstrip().splitlines()[-1] == (
        "corral: command exit code 1 (the sandbox's disk limit was reached)"
    )


@pytest.mark.parametrize("bad", ["12X", "-1", "0", "lots"])
def test_cli_bad_disk_size_is_one_line(
    bad: str, corral_cmd: list[str], cli_env: dict[str, str]
) -> None:
    r = subprocess.run([*corral_cmd, "exec", "--disk", bad, "--", "true"], env=cli_env,
                       capture_output=True, timeout=60, check=False)
    err = r.stderr.decode()
    assert r.returncode == 2 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and "--disk" in err, err


def test_corral_toml_sets_the_disk_limit() -> None:
    from corral.sandbox._definition import Sandbox

    sb = Sandbox.from_dict({"provider": {"name": "bubblewrap", "limits": {"disk": "64M"}}})
    provider = sb.get_provider()
    assert isinstance(provider, BubblewrapProvider)
    assert provider._limits.disk_bytes == LIMIT
    with pytest.raises(ConfigError, match=r"provider\.limits\.disk: 'big' is not a size"):
        BubblewrapProvider(limits={"disk": "big"})
    with pytest.raises(ConfigError, match=r"unknown key 'provider\.limits\.dsik'"):
        BubblewrapProvider(limits={"dsik": "1G"})


# ------------------------------------------------------- where it cannot be enforced


@pytest.fixture
def shared_home() -> Iterator[Path]:
    """A directory an unprivileged uid can use."""
    home = Path(tempfile.mkdtemp(prefix="corral-nobody-"))
    home.chmod(0o777)
    yield home
    shutil.rmtree(home, ignore_errors=True)


def test_not_root_a_disk_limit_is_refused_and_the_default_only_warns(
    request: pytest.FixtureRequest, shared_home: Path, corral_cmd: list[str],
    cli_env: dict[str, str],
) -> None:
    setpriv = shutil.which("setpriv")
    require(request.config, os.geteuid() == 0 and setpriv is not None,
            "root and setpriv (to run corral as an unprivileged user)", "run the tests as root")
    assert setpriv is not None
    nobody = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    env = {**cli_env, "CORRAL_HOME": str(shared_home)}

    asked = subprocess.run([*nobody, *corral_cmd, "exec", "--disk", "64M", "--", "true"],
                           env=env, capture_output=True, timeout=120, check=False)
    err = asked.stderr.decode()
    assert asked.returncode == 2 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert "disk limit of 64 MiB" in err and "cannot be enforced" in err
    assert "not running as root" in err

    default = subprocess.run([*nobody, *corral_cmd, "exec", "--", "echo", "ran"],
                             env=env, capture_output=True, timeout=120, check=False)
    assert default.returncode == 0 and default.stdout == b"ran\n", default.stderr
    assert default.stderr.decode().count("no disk quota") == 1, default.stderr


def test_without_mkfs_btrfs_a_disk_limit_is_refused(
    request: pytest.FixtureRequest, shared_home: Path, corral_home: Path
) -> None:
    """As root, with a files root that has no pool yet and no mkfs.btrfs on PATH (what a
    machine without btrfs-progs looks like): the definition asking is refused, the
    default runs without a quota."""
    require(request.config, os.geteuid() == 0, "root", "run the tests as root")
    files = shared_home / "files"  # the sandbox's host uid must be able to reach it
    script = textwrap.dedent("""
        import anyio
        from corral._errors import ConfigError
        from corral.providers._bubblewrap import BubblewrapProvider
        from corral.sandbox._contracts import ResourceLimits, SandboxSpec

        async def main():
            try:
                await BubblewrapProvider(limits={"disk": "1G"}).create()
            except ConfigError as exc:
                print("refused:", exc)
            p = BubblewrapProvider()
            h = await p.create()
            r = await h.process.exec(["true"])
            print("default:", r.ok, h.state.disk_bytes, h.state.files_dir.startswith(%r))
            await p.destroy(h.ref)

        anyio.run(main)
    """) % str(files)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(SRC), "CORRAL_BWRAP_FILES": str(files),
           "CORRAL_HOME": str(corral_home)}
    r = subprocess.run(["/usr/bin/env", sys.executable, "-c", script], env=env,
                       capture_output=True, timeout=120, check=False)
    out = r.stdout.decode()
    assert r.returncode == 0, r.stderr
    assert "refused: a disk limit of 1 GiB was asked for, but it cannot be enforced here: " \
           "mkfs.btrfs is not installed (`apt-get install btrfs-progs`); see `corral doctor`" \
           in out, out
    assert "default: True None True" in out, out
    assert not (files / diskquota.IMAGE).exists()
