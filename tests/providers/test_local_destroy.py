"""Local destroy without a host scan: the sandbox's cgroup, the tag-scan fallback, graves."""

from __future__ import annotations

import os
import signal
import sys
import threading
import subprocess
from pathlib import Path

import pytest

from corral.providers import _cgroups as cgroups
from corral.providers import _procscan as procscan
from corral.providers import _localdirs, _state
from corral.providers._local import LocalProvider
from corral.sandbox._contracts import SandboxGoneError
from corral.testing import wait_until
from corral.testing._provider_case import start_host_command

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("corral_home")]


def _daemon(pidfile: Path, *, keep_tag: bool) -> str:
    """A daemon that leaves the launcher's session (setsid) and is orphaned (its parent
    exits at once): the classic double fork. Without ``keep_tag`` it also drops the
    sandbox's environment tag, so only the cgroup can find it."""
    unset = "" if keep_tag else f"env -u {procscan.TOKEN_ENV} "
    inner = f"echo \\$\\$ > {pidfile}; exec sleep 1000"  # $$ of the grandchild
    # The pause lets corral move the launcher into the group before it forks (a fork in
    # the first moments after exec makes corral fall back to the tag scan; not tested here).
    return (f"sleep 0.3; {unset}setsid sh -c 'sh -c \"{inner}\" & exit' "
            "</dev/null >/dev/null 2>&1")


def _started(pidfile: Path) -> int:
    wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), "the daemon's pid")
    pid = int(pidfile.read_text())
    wait_until(lambda: procscan.alive(pid), "the daemon to run")
    return pid


def _environ(pid: int) -> bytes:
    with open(f"/proc/{pid}/environ", "rb") as fh:
        return fh.read()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_an_escaped_untagged_daemon_dies_with_its_cgroup(tmp_path: Path) -> None:
    if cgroups.v2_parent() is None:
        pytest.skip("no cgroup v2 hierarchy corral may create groups in")
    provider = LocalProvider()
    h = await provider.create()
    pidfile = tmp_path / "pid"
    r = await h.process.exec(_daemon(pidfile, keep_tag=False))
    assert r.ok, r
    pid = _started(pidfile)
    try:
        assert procscan.TOKEN_ENV.encode() not in _environ(pid)  # the scan could not see it
        assert not os.path.exists(os.path.join(h.private_dir, "ungrouped"))  # no scan
        # A session of its own whose leader has exited: no process group or tree finds it.
        assert not procscan.alive(os.getsid(pid)) and os.getsid(pid) != os.getsid(0)
        await provider.destroy(h.ref)
        wait_until(lambda: not procscan.alive(pid), "the daemon to die")
        assert not os.path.exists(h.state.kill_group)
    finally:
        if procscan.alive(pid):
            os.kill(pid, signal.SIGKILL)


async def test_without_a_cgroup_destroy_falls_back_to_the_tag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cgroups, "_v2_parent", None)  # as on a host without cgroup v2
    provider = LocalProvider()
    h = await provider.create()
    assert h.state.kill_group == ""
    pidfile = tmp_path / "pid"
    assert (await h.process.exec(_daemon(pidfile, keep_tag=True))).ok
    pid = _started(pidfile)
    try:
        await provider.destroy(h.ref)
        wait_until(lambda: not procscan.alive(pid), "the daemon to die")
    finally:
        if procscan.alive(pid):
            os.kill(pid, signal.SIGKILL)


async def test_a_launch_into_a_removed_group_is_refused_and_killed() -> None:
    if cgroups.v2_parent() is None:
        pytest.skip("no cgroup v2 hierarchy corral may create groups in")
    provider = LocalProvider()
    h = await provider.create()
    try:
        assert (await h.process.exec("true")).ok  # the group exists now
        os.rmdir(h.state.kill_group)  # what a concurrent destroy does after our check
        with pytest.raises(SandboxGoneError):
            await h.process.exec("sleep 1000")
    finally:
        await provider.destroy(h.ref)


async def test_host_commands_join_the_group(tmp_path: Path) -> None:
    if cgroups.v2_parent() is None:
        pytest.skip("no cgroup v2 hierarchy corral may create groups in")
    provider = LocalProvider()
    h = await provider.create()
    hc = h.host_command("echo $$ > " + str(tmp_path / "pid") + "; exec sleep 1000")
    assert hc.cgroup_procs == (os.path.join(h.state.kill_group, "cgroup.procs"),)
    proc = start_host_command(hc, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        pid = _started(tmp_path / "pid")
        assert pid in cgroups.members([h.state.kill_group])
        await provider.destroy(h.ref)
        assert proc.wait(timeout=15) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_destroyed_directories_are_deleted_and_left_graves_swept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    provider = LocalProvider()
    h = await provider.create()
    await h.fs.write("big/file", b"x" * 4096)
    await provider.destroy(h.ref)
    # gone, files and all, when destroy returns: they may hold secrets the agent wrote
    assert not Path(h.state_dir).exists()
    assert os.listdir(provider.base_dir) == []
    # A grave left by a process killed mid-deletion is deleted by the next process.
    grave = provider.base_dir / ".sb-left.deleting-0000"
    (grave / "root").mkdir(parents=True)
    (grave / "root" / "f").write_bytes(b"x")
    monkeypatch.setattr(_state, "_made_roots", set())
    assert LocalProvider().base_dir.is_dir()  # as in a new process
    _state.wait_for_graves()
    assert not grave.exists()


async def test_descendants_from_the_children_files_match_a_full_scan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proc = subprocess.Popen(["sh", "-c", "sleep 100 & (sleep 100 & wait) & wait"])
    try:
        wait_until(lambda: len(procscan.descendants(proc.pid)) == 3, "three descendants")
        fast = sorted(procscan.descendants(proc.pid))
        monkeypatch.setattr(procscan, "_HAS_CHILDREN_FILE", False)
        assert sorted(procscan.descendants(proc.pid)) == fast
    finally:
        for p in procscan.descendants(proc.pid):
            os.kill(p, signal.SIGKILL)
        proc.kill()
        proc.wait()


def test_state_is_saved_whole_and_read_back(tmp_path: Path) -> None:
    state = _state.SandboxState(id="sb-x", provider="local", token="t", env={"A": "b"},
                                kill_group="/sys/fs/cgroup/corral/x")
    where = tmp_path / "sb"
    where.mkdir()
    state.save(where)
    assert os.listdir(where) == ["state.json"]  # no temporary file left
    back = _state.SandboxState.load(where)
    assert back == state


# ------------------------------------------------------------------ lazy directories


def _files_under(root: Path) -> list[str]:
    return sorted(str(Path(d, f)) for d, _, files in os.walk(root) for f in files)


async def test_create_makes_one_directory_and_first_use_makes_the_rest() -> None:
    provider = LocalProvider()
    h = await provider.create()
    where = Path(h.state_dir)
    # nothing in it: the state is the directory's attribute (a file only on a filesystem
    # without user attributes)
    assert os.listdir(where) in ([], ["state.json"])
    # another process resumes a never used sandbox and runs in it
    again = await LocalProvider().resume(h.id)
    assert again is not None
    r = await again.process.exec('test "$PWD" = "$CORRAL_WORKSPACE" && test -d "$HOME" '
                                 '&& test -d "$TMPDIR" && touch "$TMPDIR/t"')
    assert r.ok, r
    assert "root" in os.listdir(where)  # (private/ too if the launch was marked ungrouped)
    assert oct(os.stat(where / "root" / "tmp").st_mode & 0o7777) == "0o1777"
    assert os.path.isdir(h.private_dir)
    await provider.destroy(h.ref)
    assert not where.exists()


async def test_a_wiped_sandbox_is_not_resumed() -> None:
    provider = LocalProvider()
    h = await provider.create()
    await h.fs.write("f", b"x")
    import shutil

    shutil.rmtree(Path(h.state_dir) / "root" / "workspace")
    assert await provider.resume(h.id) is None
    await provider.destroy(h.ref)


async def test_a_destroyed_handle_makes_no_directories() -> None:
    provider = LocalProvider()
    h = await provider.create()
    await provider.destroy(h.ref)
    with pytest.raises(SandboxGoneError):
        await h.process.exec("true")
    with pytest.raises(SandboxGoneError):
        await h.fs.write("f", b"x")
    assert os.listdir(provider.base_dir) == []


@pytest.mark.parametrize("plant", [
    'echo "$SECRET" > "$TMPDIR/s"',                       # a file in an area
    'mkdir "$CORRAL_WORKSPACE/$SECRET"',                  # a directory named by a secret
    'rmdir "$HOME" && echo "$SECRET" > "$HOME"',         # a file by a skeleton dir's name
    'mkdir -p "$HOME/../../private" && echo "$SECRET" > "$HOME/../../private/agent"',
    'echo "$SECRET" > "$HOME/../../$SECRET"',             # beside state.json
])
async def test_what_the_agent_left_is_gone_when_destroy_returns(
    plant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The digger holds what it is given (so a race with it cannot hide a leak).
    handed: list[Path] = []
    monkeypatch.setattr(_localdirs, "delete_later", handed.append)
    provider = LocalProvider()
    h = await provider.create()
    secret = "s3cret" + os.urandom(6).hex()
    r = await h.process.exec(plant, env={"SECRET": secret})
    assert r.ok, r
    await provider.destroy(h.ref)
    # Only empty directories corral made may still wait for the digger: no file, and no
    # name the agent chose.
    left = [str(Path(d, n)) for d, dirs, files in os.walk(provider.base_dir)
            for n in dirs + files]
    assert not _files_under(provider.base_dir), left
    assert not any(secret in p for p in left), left
    assert handed == []  # not a skeleton: deleted before destroy returned
    assert os.listdir(provider.base_dir) == []


async def test_an_unused_skeleton_is_left_to_the_digger_and_deleted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handed: list[Path] = []
    monkeypatch.setattr(_localdirs, "delete_later", handed.append)
    provider = LocalProvider()
    h = await provider.create()
    assert (await h.process.exec("true")).ok
    h.private_dir  # noqa: B018 - made on first use
    await provider.destroy(h.ref)
    assert not Path(h.state_dir).exists()
    assert len(handed) == 1 and not _files_under(handed[0])
    monkeypatch.undo()
    _state.delete_later(handed[0])
    _state.wait_for_graves()
    assert os.listdir(provider.base_dir) == []


def test_a_used_local_sandbox_dir_is_not_copied() -> None:
    from corral.sandbox._copyguard import StateGuard

    guard = StateGuard(roots=(), store=None)
    assert guard.skip_dir("/x/sb-1", ["state.json", "root"]) is not None
    assert guard.skip_dir("/x/sb-1", ["state.json", "private"]) is not None
    assert guard.skip_dir("/x/project", ["state.json", "src"]) is None


def test_a_process_that_destroys_and_exits_leaves_nothing(corral_home: Path) -> None:
    code = (
        "import anyio\n"
        "from corral.providers._local import LocalProvider\n"
        "async def main():\n"
        "    p = LocalProvider()\n"
        "    for _ in range(5):\n"
        "        h = await p.create()\n"
        "        assert (await h.process.exec('true')).ok\n"
        "        await p.destroy(h.ref)\n"
        "    print(p.base_dir)\n"
        "anyio.run(main)\n"
    )
    env = dict(os.environ, CORRAL_HOME=str(corral_home))
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True).stdout
    # The graves handed to the digger are deleted before the interpreter exits.
    assert os.listdir(out.strip()) == []


def test_the_digger_counts_a_grave_whose_deletion_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(grave: Path) -> bool:
        raise PermissionError(13, "refused", str(grave))

    monkeypatch.setattr(_state, "remove_if_skeleton", broken)
    grave = tmp_path / ".sb-x.deleting-0000"
    (grave / "root").mkdir(parents=True)
    _state.delete_later(grave)
    waiter = threading.Thread(target=_state.wait_for_graves, daemon=True)
    waiter.start()
    waiter.join(30)
    assert not waiter.is_alive()  # the exit handler's wait returns (it would hang for ever)
    assert not grave.exists()
