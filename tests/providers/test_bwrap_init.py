"""The sandbox's pid 1 (corral.providers._bwrap_init): the C init and the perl fallback
keep the same guarantees, and the C init's cache cannot be swapped for another program.

The attacks run in real bubblewrap sandboxes, once per init; the prefix parser runs on the
host against hypothesis-made inputs, C and perl side by side.
"""

# ruff: noqa: ASYNC220

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import platform
import shutil
import stat
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.providers import _bwrap_init as bwrap_init
from corral.providers import _cgroups as cgroups
from corral.providers._bubblewrap import (
    _PRCTL_NR,
    BubblewrapHandle,
    BubblewrapProvider,
    launch_prefix,
)
from corral.testing import wait_until_async
from corral.testing._plugin import require

pytestmark = pytest.mark.anyio

PY = "/usr/bin/python3"
HAS_CC = any(shutil.which(c) for c in ("cc", "gcc", "clang"))


@pytest.fixture(params=["auto", "perl"])
def provider(request: pytest.FixtureRequest, corral_home: Path, need_bwrap: None) -> BubblewrapProvider:
    if request.param == "auto":
        require(request.config, HAS_CC, "a C compiler for the C init", "apt-get install gcc")
    p = BubblewrapProvider(init=request.param)
    assert p.init.kind == ("c" if request.param == "auto" else "perl"), p.init
    return p


@pytest.fixture
async def sandbox(provider: BubblewrapProvider) -> AsyncIterator[BubblewrapHandle]:
    h = await provider.create()
    try:
        yield h
    finally:
        await provider.destroy(h.ref)


def inside_init(provider: BubblewrapProvider) -> str:
    return bwrap_init.INSIDE_PATH if provider.init.kind == "c" else "/usr/bin/perl"


async def test_the_command_cannot_forge_its_status_on_any_descriptor(sandbox: BubblewrapHandle) -> None:
    forge = ("import os\nfor fd in range(3, 1024):\n"
             "    try: os.write(fd, b'0\\n')\n    except OSError: pass\n")
    r = await sandbox.process.exec(["sh", "-c", f"{PY} -c \"$1\"; exit 7", "sh", forge])
    assert (r.exit_code, r.signal) == (7, None), r


async def test_the_init_cannot_be_replaced_from_inside(
    provider: BubblewrapProvider, sandbox: BubblewrapHandle
) -> None:
    target = inside_init(provider)
    host = provider.init.path or Path("/usr/bin/perl")
    before = hashlib.sha256(host.read_bytes()).hexdigest()
    attempts = [
        f"printf 'exit 0' > {target}",
        f"cp /bin/true {target}",
        f"chmod 777 {target}",
        f"rm -f {target}",
        f"mv {target} /tmp/init",
        f"ln -sf /bin/true {target}",
        f"umount {target}",
        f"mount --bind /bin/true {target}",
    ]
    script = "; ".join(f"if {a} 2>/dev/null; then echo 'DONE: {a}'; fi" for a in attempts)
    r = await sandbox.process.exec(["sh", "-c", script + "; exit 0"])
    assert r.ok and r.stdout == b"", r.stdout  # every attempt failed
    assert hashlib.sha256(host.read_bytes()).hexdigest() == before
    # The next command is still started, and reported, by the genuine init.
    r = await sandbox.process.exec(["sh", "-c", "exit 5"])
    assert (r.exit_code, r.signal) == (5, None), r


async def test_pid_1_cannot_be_traced_read_or_signalled(sandbox: BubblewrapHandle) -> None:
    probe = (
        "import ctypes, os, signal\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print('attach', libc.ptrace(16, 1, 0, 0))\n"
        "for f in ('environ', 'mem', 'maps'):\n"
        "    try: open(f'/proc/1/{f}', 'rb').read(1); print('read', f)\n"
        "    except OSError: pass\n"
        "try: print('fds', os.listdir('/proc/1/fd'))\n"
        "except OSError: pass\n"
        "for s in (signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP, signal.SIGSEGV):\n"
        "    os.kill(1, s)\n"  # delivered to nothing: pid 1 has no handlers
        "print('alive')\n"
    )
    r = await sandbox.process.exec(["sh", "-c", f"{PY} -c \"$1\"; exit 9", "sh", probe], timeout=60)
    assert r.stdout == b"attach -1\nalive\n", r.stdout
    assert (r.exit_code, r.signal, r.timed_out) == (9, None, False), r


async def test_every_process_runs_as_the_sandboxs_host_uid(
    provider: BubblewrapProvider, sandbox: BubblewrapHandle, request: pytest.FixtureRequest
) -> None:
    # The uid drop (corral's launcher with the C init, setpriv with perl): bwrap and all
    # it starts are the host uid, real, effective, saved and filesystem, with no groups.
    uid = sandbox.state.host_uid
    require(request.config, uid is not None and bool(sandbox.state.cgroups),
            "root with cgroups (sandboxes run as an unprivileged host uid)", "run as root")
    proc = await sandbox.process.spawn(["sleep", "60"])
    try:
        def seen() -> list[dict[str, str]]:
            out = []
            for pid in sorted(cgroups.members(sandbox.state.cgroups)):
                with contextlib.suppress(OSError):
                    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
                    out.append({k: v.strip() for k, v in (ln.split(":", 1) for ln in lines)})
            return out

        # Through the agent: its bwrap, the agent, the command's init (a fork of the
        # agent) and the command, and the warm spare (the next command's init and its
        # process, waiting).
        want = (["bwrap", *["corral-agent"] * 3, "corral-spare", "sleep"]
                if provider.command_path()[0] == "agent"
                else ["bwrap", "corral-init" if provider.init.kind == "c" else "perl", "sleep"])
        await wait_until_async(lambda: sorted(s["Name"] for s in seen()) == want,
                               "bwrap, the init and sleep", interval=0.02)
        for status in seen():
            assert status["Uid"].split() == [str(uid)] * 4, status
            assert status["Gid"].split() == [str(uid)] * 4, status
            assert status["Groups"] == "" and status["NoNewPrivs"] == "1", status
    finally:
        await proc.kill(signal.SIGKILL)
        await proc.wait()
        await proc.aclose()


async def test_filters_and_flags_reach_the_command(sandbox: BubblewrapHandle) -> None:
    r = await sandbox.process.exec(["cat", "/proc/self/status"])
    status = dict(line.split(":", 1) for line in r.stdout.decode().splitlines())
    assert status["NoNewPrivs"].strip() == "1"
    assert status["Seccomp"].strip() == "2"  # the init's filter (no btrfs subvolumes)


async def test_orphans_are_reaped_while_the_command_runs(sandbox: BubblewrapHandle) -> None:
    # Orphans' zombies go to pid 1; an init that did not reap would leave them forever.
    # Each orphan notes its pid; the script waits (10 s at most) until every noted pid is
    # gone from /proc (reaped), then prints how many are left: 0, or 5 zombies.
    script = r"""
for i in 1 2 3 4 5; do (sh -c "echo \$\$ > /tmp/orphan$i; exec sleep 0.01" &); done
i=0
while [ "$(cat /tmp/orphan* 2>/dev/null | wc -l)" -lt 5 ] && [ $i -lt 1000 ]; do
  sleep 0.01; i=$((i+1)); done
left() { n=0; for p in $(cat /tmp/orphan*); do [ -e /proc/$p ] && n=$((n+1)); done; echo $n; }
i=0
while [ "$(left)" != 0 ] && [ $i -lt 1000 ]; do sleep 0.01; i=$((i+1)); done
cat /tmp/orphan* | wc -l; left
"""
    r = await sandbox.process.exec(["sh", "-c", script], timeout=60)
    assert r.ok and r.stdout.split() == [b"5", b"0"], r


async def test_exit_statuses_and_stdin_after_the_prefix(sandbox: BubblewrapHandle) -> None:
    missing = await sandbox.process.exec(["no-such-program"])
    assert missing.exit_code == 127 and b"no-such-program" in missing.stderr
    cannot = await sandbox.process.exec(["/etc/passwd"])
    assert cannot.exit_code == 126, cannot
    killed = await sandbox.process.exec(["sh", "-c", "kill -SEGV $$"])
    assert (killed.exit_code, killed.signal) == (139, 11), killed
    data = os.urandom(200_000)
    echoed = await sandbox.process.exec(["cat"], stdin=data)
    assert echoed.stdout == data  # the init read its prefix and not one byte more
    env = await sandbox.process.exec(["sh", "-c", 'printf %s "$X"; pwd'], env={"X": "a=b\nc"},
                                     cwd="/tmp")
    assert env.stdout == b"a=b\nc/tmp\n", env


# ----------------------------------------------------------------- the cache


@pytest.fixture
def reachable_dir() -> Iterator[Path]:
    """A fresh directory other users can enter (pytest's tmp_path is 0700 as root)."""
    d = Path(tempfile.mkdtemp(prefix="corral-init-test-", dir="/tmp"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


FORGER = "#!/bin/sh\necho 0 >&$1\nexit 0\n"  # reports "exited 0", whatever ran


def need_cc(request: pytest.FixtureRequest) -> None:
    require(request.config, HAS_CC, "a C compiler for the C init", "apt-get install gcc")


@pytest.mark.parametrize("plant", ["foreign owner", "group writable", "symlink", "broken"])
def test_a_planted_init_in_the_cache_is_never_used(
    plant: str, reachable_dir: Path, request: pytest.FixtureRequest
) -> None:
    need_cc(request)
    cache = reachable_dir / "init"
    cache.mkdir(mode=0o755)
    binary = cache / f"init-{bwrap_init._KEY}"
    forger = reachable_dir / "forger"
    forger.write_text(FORGER)
    forger.chmod(0o755)
    if plant == "symlink":
        binary.symlink_to(forger)
    elif plant == "broken":  # ours, but it does not run (a stale or half-written build)
        binary.write_text("#!/bin/sh\nexit 1\n")
        binary.chmod(0o755)
    else:
        binary.write_text(FORGER)
        binary.chmod(0o775 if plant == "group writable" else 0o755)
        if plant == "foreign owner":
            os.chown(binary, 4321, 4321)
    # As root the launcher (run as root on the host!) is planted the same way.
    launcher = cache / f"launch-{bwrap_init._KEY}"
    os.link(binary, launcher, follow_symlinks=False)
    found = bwrap_init.find_init(cache)
    assert found.kind == "c" and found.path == binary, found
    assert found.launcher == (launcher if os.geteuid() == 0 else None)
    for program in [binary, launcher] if os.geteuid() == 0 else [binary]:
        st_ = os.lstat(program)
        assert stat.S_ISREG(st_.st_mode) and st_.st_uid == os.geteuid()
        assert stat.S_IMODE(st_.st_mode) == 0o755
        assert program.read_bytes()[:4] == b"\x7fELF"  # rebuilt, not the forger
    assert forger.read_text() == FORGER


@pytest.mark.parametrize("weakness", ["foreign dir", "world writable dir", "unreachable parent"])
def test_a_cache_others_could_write_falls_back_to_perl(
    weakness: str, reachable_dir: Path, request: pytest.FixtureRequest
) -> None:
    if weakness == "unreachable parent":
        require(request.config, os.geteuid() == 0, "root (the sandboxes' uid must reach the cache)",
                "run the tests as root")
    cache = reachable_dir / "init"
    cache.mkdir(mode=0o755)
    if weakness == "foreign dir":
        os.chown(cache, 4321, 4321)
    elif weakness == "world writable dir":
        cache.chmod(0o777)
    else:
        reachable_dir.chmod(0o700)
    found = bwrap_init.find_init(cache)
    assert (found.kind, found.path) == ("perl", None), found
    assert str(cache if weakness != "unreachable parent" else reachable_dir) in found.reason
    assert list(cache.iterdir()) == []  # nothing built where others could swap it


def test_the_real_cache_is_writable_by_root_only(request: pytest.FixtureRequest) -> None:
    need_cc(request)
    found = bwrap_init.find_init()
    assert found.path is not None
    for p in [found.path, *found.path.parents]:
        st_ = os.lstat(p)
        assert st_.st_uid in (0, os.geteuid()), p
        assert not st_.st_mode & 0o022 or (st_.st_mode & stat.S_ISVTX and p != found.path.parent), p


# ----------------------------------------------------------------- the prefix parser

NAME = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True)
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=40)


def run_init(argv_head: list[str], stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*argv_head, "-1", "-1", "-", *([] if "-e" not in argv_head else
                                                         [str(_PRCTL_NR[platform.machine()])])],
                          input=stdin, env={}, capture_output=True, timeout=30, check=False)


def inits() -> list[list[str]]:
    found = bwrap_init.find_init()
    heads = [["/usr/bin/perl", "-e", bwrap_init.PERL_INIT, "--"]]
    if found.path is not None:
        heads.append([str(found.path)])
    return heads


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(env=st.dictionaries(NAME, TEXT, max_size=6), args=st.lists(TEXT, max_size=6),
       cwd=st.sampled_from(["/", "/tmp", "/usr/bin"]))
def test_both_inits_run_exactly_what_the_prefix_says(
    env: dict[str, str], args: list[str], cwd: str
) -> None:
    env = {**env, "PATH": "/usr/bin:/bin"}
    argv = ["printf", "%s\\0", cwd, *args]
    expected_argv = b"".join(a.encode() + b"\0" for a in [cwd, *args])
    for head in inits():
        done = run_init(head, launch_prefix(cwd, env, argv) + b"rest")
        assert (done.returncode, done.stdout) == (0, expected_argv), (head[0], done)
        shown = run_init(head, launch_prefix(cwd, env, ["env", "-0"]))
        got = dict(e.split("=", 1) for e in shown.stdout.decode().split("\0")[:-1])
        assert got == env, head[0]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(junk=st.one_of(
    st.binary(max_size=64),
    st.builds(lambda n, b: str(n).encode() + b"\n" + b, st.integers(0, 10**12), st.binary(max_size=64)),
))
def test_a_malformed_prefix_runs_nothing(junk: bytes) -> None:
    head = inits()[-1]
    done = run_init(head, junk)
    assert done.returncode >= 0, done  # the parser never crashes (no signal death)
    if done.returncode != 125:
        # Only a well-formed prefix runs anything, and then whatever it names ran or failed.
        assert done.returncode in (0, 1, 126, 127) or done.stderr.startswith(b"corral: "), done


@pytest.mark.parametrize("args", [["0", "0"], ["1000", "0"], ["-1", "5"], ["4294967295", "5"],
                                  ["12x", "5"], ["", "5"]])
def test_the_launcher_never_runs_a_program_as_root(
    args: list[str], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    need_cc(request)
    launcher = bwrap_init.find_init().launcher
    require(request.config, launcher is not None, "root (the launcher drops root to the host uid)",
            "run the tests as root")
    marker = tmp_path / "ran"
    for program in (["/bin/sh", "-c", f"touch {marker}"], ["sh", "-c", f"touch {marker}"]):
        done = subprocess.run([str(launcher), *args, *program], capture_output=True, check=False,
                              timeout=30)
        assert done.returncode == 125 and done.stderr.startswith(b"corral-launch: "), done
        assert not marker.exists()
    # A good uid and a relative program: refused too (no PATH search as root).
    done = subprocess.run([str(launcher), "65534", "65534", "sh", "-c", "exit 0"],
                          capture_output=True, check=False, timeout=30)
    assert done.returncode == 125, done


def test_a_removed_cache_entry_is_built_again(reachable_dir: Path, request: pytest.FixtureRequest) -> None:
    need_cc(request)
    cache = reachable_dir / "init"
    first = bwrap_init.find_init(cache)
    assert first.path is not None and first.kind == "c"
    first.path.unlink()  # e.g. /var/lib cleaned under a long-running server
    again = bwrap_init.find_init(cache)
    assert again.path == first.path and again.path.read_bytes()[:4] == b"\x7fELF"
