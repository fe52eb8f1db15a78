"""Local commands start inside their sandbox's cgroup (``_cgspawn``), with the move as the
fallback; and the in-group start behaves like ``subprocess.Popen`` in what corral uses."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.providers import _cgroups as cgroups
from corral.providers import _cgspawn as cgspawn
from corral.providers import _procscan as procscan
from corral.providers._local import LocalProvider
from corral.testing import wait_until

pytestmark = [pytest.mark.usefixtures("corral_home")]

ENV = {"PATH": os.defpath, "LC_ALL": "C"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def spawner() -> cgspawn.Spawner:
    found = cgspawn.spawner()
    if found is None:
        pytest.skip(f"no in-group spawner here: {cgspawn.reason()}")
    return found


@pytest.fixture
def group() -> Iterator[str]:
    if cgroups.v2_parent() is None:
        pytest.skip("no cgroup v2 hierarchy corral may create groups in")
    path = cgroups.kill_group_for(f"test-cgspawn.{os.getpid()}")
    assert cgroups.ensure_kill_group(path)
    yield path
    assert cgroups.kill_group(path, timeout=10)


def _start(spawner: cgspawn.Spawner, argv: list[str], *, fd: int = -1, env: dict[str, str] | None = None,
           cwd: str | None = None) -> subprocess.Popen[bytes]:
    return cgspawn.InGroupPopen(argv, spawner=spawner, cgroup_fd=fd, env=env or ENV, cwd=cwd)


def _run(spawner: cgspawn.Spawner, argv: list[str], **kw: object) -> tuple[int, bytes, bytes]:
    p = _start(spawner, argv, **kw)  # type: ignore[arg-type]
    out, err = p.communicate(b"", timeout=30)
    return p.returncode, out, err


def _open(group: str) -> int:
    return os.open(group, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def _relative(group: str) -> str:
    return "/" + os.path.relpath(group, os.path.dirname(cgroups.v2_parent() or "/"))


# ------------------------------------------------------------------ InGroupPopen itself

def test_the_child_is_born_in_the_group(spawner: cgspawn.Spawner, group: str) -> None:
    fd = _open(group)
    try:
        p = _start(spawner, ["sh", "-c", "cat /proc/self/cgroup; sleep 1000"], fd=fd)
    finally:
        os.close(fd)
    try:
        assert p.pid in cgroups.members([group])
        assert p.stdout is not None
        line = p.stdout.readline()
        while line and not line.startswith(b"0::"):
            line = p.stdout.readline()
        assert line.decode().strip() == "0::" + _relative(group)
    finally:
        p.kill()
        p.wait()
        assert p.returncode == -signal.SIGKILL


def test_a_dead_group_starts_nothing(spawner: cgspawn.Spawner, group: str) -> None:
    fd = _open(group)
    try:
        os.rmdir(group)
        with pytest.raises(cgroups.GroupGone):
            _start(spawner, ["sleep", "1000"], fd=fd)
    finally:
        os.close(fd)
        cgroups.ensure_kill_group(group)  # for the fixture's teardown


def test_pipes_env_cwd_status(spawner: cgspawn.Spawner, tmp_path: Path) -> None:
    p = _start(spawner, ["sh", "-c", 'read x; echo "$x $FOO $(pwd)"; echo e >&2; exit 3'],
               env={**ENV, "FOO": "bar"}, cwd=str(tmp_path))
    out, err = p.communicate(b"in\n", timeout=30)
    assert (p.returncode, out, err) == (3, f"in bar {tmp_path}\n".encode(), b"e\n")
    rc, out, _ = _run(spawner, ["env"], env={"A": "1", "PATH": os.defpath})
    assert rc == 0 and sorted(out.decode().split()) == ["A=1", f"PATH={os.defpath}"]


def test_own_session_and_no_leaked_descriptors(spawner: cgspawn.Spawner) -> None:
    leak = os.dup2(os.open(os.devnull, os.O_RDONLY), 77, inheritable=True)
    try:
        rc, out, _ = _run(spawner, ["sh", "-c", "cut -d' ' -f6 /proc/$$/stat; echo $$; "
                                    "test -e /proc/$$/fd/77 && echo leaked || echo closed"])
    finally:
        os.close(leak)
    sid, pid, fd = out.decode().split()
    assert rc == 0 and sid == pid and fd == "closed"


def test_signal_state_is_what_popen_gives(spawner: cgspawn.Spawner) -> None:
    argv = ["grep", "-E", "^(SigBlk|SigIgn)", "/proc/self/status"]
    ours = _run(spawner, argv)
    theirs = subprocess.run(argv, env=ENV, capture_output=True, check=False)
    assert ours == (0, theirs.stdout, b"")
    ignored = int(ours[1].decode().split("SigIgn:")[1].split()[0], 16)
    assert not ignored & 1 << (signal.SIGPIPE - 1)  # Python ignores it; the child must not


def test_exec_errors_are_raised_like_popen(spawner: cgspawn.Spawner, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as nf:
        _start(spawner, ["no-such-command-corral"])
    assert nf.value.filename == "no-such-command-corral"
    with pytest.raises(FileNotFoundError) as cwd:
        _start(spawner, ["true"], cwd=str(tmp_path / "missing"))
    assert cwd.value.filename == str(tmp_path / "missing")
    plain = tmp_path / "plain"
    plain.write_text("echo no\n")
    with pytest.raises(PermissionError):
        _start(spawner, [str(plain)])


def test_path_is_searched_in_order(spawner: cgspawn.Spawner, tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    (first / "tool").write_text("#!/bin/sh\necho a\n")  # not executable: skipped
    (second / "tool").write_text("#!/bin/sh\necho b\n")
    (second / "tool").chmod(0o755)
    rc, out, _ = _run(spawner, ["tool"], env={"PATH": f"{first}:{second}:{os.defpath}"})
    assert (rc, out) == (0, b"b\n")


def test_works_when_the_parent_has_no_stdio(spawner: cgspawn.Spawner, tmp_path: Path) -> None:
    # The pipes then get descriptors 0..2 in the parent: the child must not clobber them.
    result = tmp_path / "result"
    script = (
        "import os, sys\n"
        "from corral.providers._cgspawn import spawner, InGroupPopen\n"
        "for fd in (0, 1, 2): os.close(fd)\n"
        "p = InGroupPopen(['sh', '-c', 'read x; echo $x; echo err >&2'], spawner=spawner(),"
        " cgroup_fd=-1, env={'PATH': os.defpath}, cwd=None)\n"
        "out, err = p.communicate(b'hello\\n', timeout=30)\n"
        f"open({str(result)!r}, 'w').write(repr((p.returncode, out, err)))\n"
    )
    subprocess.run([sys.executable, "-c", script], env={**os.environ}, check=True, timeout=60)
    assert result.read_text() == repr((0, b"hello\n", b"err\n"))


# ------------------------------------------------------------------ the local provider

def _in_group(out: bytes, group: str) -> bool:
    return f"0::{_relative(group)}" in out.decode().splitlines()


@pytest.mark.anyio
async def test_local_commands_start_in_the_group_without_a_move(
    spawner: cgspawn.Spawner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if cgroups.v2_parent() is None:
        pytest.skip("no cgroup v2 hierarchy corral may create groups in")

    def no_move(group: str, pid: int) -> bool:
        raise AssertionError("the command was moved, not born in its group")

    monkeypatch.setattr(cgroups, "join_kill_group", no_move)
    provider = LocalProvider()
    h = await provider.create()
    r = await h.process.exec("cat /proc/self/cgroup")
    assert r.ok and _in_group(r.stdout, h.state.kill_group), r
    # A daemon that forks away at once and drops its tag: no race with a move any more,
    # so no fallback scan is needed and destroy still kills it.
    pidfile = tmp_path / "pid"
    inner = f"echo \\$\\$ > {pidfile}; exec sleep 1000"
    r = await h.process.exec(f"env -u {procscan.TOKEN_ENV} setsid sh -c 'sh -c \"{inner}\" & "
                             "exit' </dev/null >/dev/null 2>&1")
    assert r.ok, r
    wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), "the daemon's pid")
    pid = int(pidfile.read_text())
    try:
        assert not os.path.exists(os.path.join(h.private_dir, "ungrouped"))
        await provider.destroy(h.ref)
        wait_until(lambda: not procscan.alive(pid), "the daemon to die")
    finally:
        if procscan.alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["no spawner", "clone3 refused"])
async def test_without_an_in_group_start_commands_are_moved(
    how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if cgroups.v2_parent() is None:
        pytest.skip("no cgroup v2 hierarchy corral may create groups in")
    if how == "no spawner":
        monkeypatch.setattr(cgspawn, "spawner", lambda directory=None: None)
    else:
        def refused(*args: object) -> int:
            raise cgspawn.CloneRefused(errno.ENOSYS, os.strerror(errno.ENOSYS))

        monkeypatch.setattr(cgspawn.Spawner, "start", refused)
    moved: list[int] = []
    join = cgroups.join_kill_group

    def counting(group: str, pid: int) -> bool:
        moved.append(pid)
        return join(group, pid)

    monkeypatch.setattr(cgroups, "join_kill_group", counting)
    provider = LocalProvider()
    h = await provider.create()
    try:
        # The pause lets the move happen before the shell forks cat.
        r = await h.process.exec("sleep 0.2; cat /proc/self/cgroup")
        assert r.ok and _in_group(r.stdout, h.state.kill_group), r
        assert len(moved) == 1
        r = await h.process.exec(["no-such-command-corral"])
        assert r.exit_code == 127 and b"No such file" in r.stderr
    finally:
        await provider.destroy(h.ref)


@pytest.mark.anyio
async def test_a_missing_command_still_reports_127(spawner: cgspawn.Spawner) -> None:
    provider = LocalProvider()
    h = await provider.create()
    try:
        r = await h.process.exec(["no-such-command-corral"])
        assert r.exit_code == 127 and b"no-such-command-corral: No such file" in r.stderr, r
    finally:
        await provider.destroy(h.ref)


# ------------------------------------------------------------------ the cache

def test_a_planted_library_is_never_loaded(spawner: cgspawn.Spawner, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    planted = cache / f"cgspawn-{cgspawn._KEY}.so"
    planted.write_bytes(b"not a library")
    planted.chmod(0o666)  # others could have swapped it
    found = cgspawn.spawner(cache)
    assert found is not None, cgspawn.reason(cache)
    assert planted.stat().st_mode & 0o022 == 0 and planted.read_bytes() != b"not a library"
    assert _run(found, ["sh", "-c", "exit 5"])[0] == 5


def test_a_cache_others_can_write_is_not_used(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o777)
    assert cgspawn.spawner(cache) is None
    assert "not safe" in cgspawn.reason(cache)
    assert list(cache.iterdir()) == []
