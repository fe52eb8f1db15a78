"""The attacks only a container has (docker provider, real dockerd, real CLI).

On docker the run's supervisor is a root process in the agent's own container, and
everything the hosts know about a sandbox is the daemon's: its labels, volumes and
configuration. So the agent (uid 1000) attacks the supervisor beside it (its journal, nonce,
pipes, ``/proc``, signals, ptrace), the container's memory so that the host can no longer
exec anything in it, and every mount for a way to the Docker socket or the host; whoever
can reach the daemon forges the labels and volumes ``corral gc`` trusts; and secrets are
looked for wherever the daemon keeps what corral gave it (``docker inspect``, exec
configurations, image history). The attacks shared with bubblewrap are parametrized in
``test_sandbox_boundary`` and ``tests/providers/test_isolation.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

from corral.providers._docker_client import docker_errors
from corral.providers._docker import DockerHandle, DockerProvider, container_name, volume_names
from corral.sandbox._contracts import SandboxSpec
from corral.testing import wait_until
from tests.helpers import HelloServer
from tests.security.test_sandbox_boundary import last_run, run

pytestmark = pytest.mark.usefixtures("need_docker")

PY = "/usr/bin/python3"


@pytest.fixture
def env(cli_env: dict[str, str]) -> Iterator[dict[str, str]]:
    """The CLI's environment; the docker sandboxes of this test's runs go with the test."""
    yield cli_env
    _destroy_run_sandboxes(cli_env)


def _destroy_run_sandboxes(env: dict[str, str]) -> None:
    r = subprocess.run(_corral("ls", "--json", "--limit", "1000"), env=env, capture_output=True,
                       timeout=120, check=False)
    provider = DockerProvider()
    for record in (json.loads(r.stdout) if r.returncode == 0 else []):
        ref = record.get("sandbox_ref") or {}
        if ref.get("provider") == "docker" and ref.get("id"):
            provider._remove(str(ref["id"]))


def _corral(*args: str) -> list[str]:
    return [sys.executable, "-m", "corral", *args]


def _empty(tmp_path: Path) -> Path:
    """An empty workspace (the default, the test's cwd, would copy the checkout)."""
    path = tmp_path / "empty-ws"
    path.mkdir(exist_ok=True)
    return path


def _config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "cfg" / "corral.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(textwrap.dedent(body))
    return path


# ------------------------------------------------- the agent against the root supervisor

PROBE = r"""
import ctypes, json, os, signal, stat, sys
libc = ctypes.CDLL(None, use_errno=True)
out = {"uid": os.getuid(), "fds": sorted(os.listdir("/proc/self/fd"))}
out["stdio_pipes"] = [stat.S_ISFIFO(os.fstat(fd).st_mode) for fd in (0, 1, 2)]
def status(pid):
    try:
        return dict(l.split(":", 1) for l in open(f"/proc/{pid}/status").read().splitlines())
    except OSError:
        return {}
def cmd(pid):
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
    except OSError:
        return ""
roots = [int(p) for p in os.listdir("/proc") if p.isdigit()
         and status(p).get("Uid", "x").split()[:1] == ["0"]]
# the supervisor's mode is its last argument (the root helpers reading the journal run
# the same source with "read" or "status")
sup = [p for p in roots if "durable-run supervisor" in cmd(p)
       and cmd(p).rstrip().endswith(" start")]
out["supervisors"] = len(sup)
reached = []
for pid in [1] + sup:
    for what in ("environ", "mem", "fd", "fdinfo", "root/run/corral-private", "stack",
                 "map_files", "syscall", "auxv", "cwd/"):
        try:
            p = f"/proc/{pid}/{what}"
            (os.listdir if what in ("fd", "fdinfo", "map_files", "cwd/") else
             lambda x: open(x, "rb").read(1))(p)
            reached.append(p)
        except OSError:
            pass
    for fd in range(0, 16):
        try:
            os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR)
            reached.append(f"fd {fd} of {pid}")
        except OSError:
            pass
    for sig in (signal.SIGSTOP, signal.SIGKILL, signal.SIGTERM):
        try:
            os.kill(pid, sig)
            reached.append(f"signal {sig} to {pid}")
        except OSError:
            pass
    if libc.ptrace(16, pid, 0, 0) == 0:  # PTRACE_ATTACH
        reached.append(f"ptrace {pid}")
    if libc.ptrace(0x4206, pid, 0, 0) == 0:  # PTRACE_SEIZE
        reached.append(f"seize {pid}")
    try:
        pidfd = os.pidfd_open(pid)
        for fd in range(0, 32):
            if libc.syscall(438, pidfd, fd, 0) >= 0:  # pidfd_getfd
                reached.append(f"getfd {fd} of {pid}")
        if libc.syscall(424, pidfd, 9, 0, 0) == 0:  # pidfd_send_signal SIGKILL
            reached.append(f"pidfd kill {pid}")
    except OSError:
        pass
for path in ("/run/corral-private", "/run/corral-private/runs"):
    try:
        os.listdir(path)
        reached.append("list " + path)
    except OSError:
        pass
    try:
        open(path + "/x", "w")
        reached.append("create in " + path)
    except OSError:
        pass
mirror = sys.argv[1]
for path in (mirror, os.path.dirname(mirror)):
    if os.path.exists(path):
        reached.append("host " + path)
out["oom_score_adj"] = open("/proc/self/oom_score_adj").read().strip()
out["reached"] = reached
print(json.dumps(out), flush=True)
"""


def test_the_agent_cannot_reach_the_root_supervisor(tmp_path: Path, env: dict[str, str],
                                                   corral_home: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "probe.py").write_text(PROBE)
    r = run(_corral("run", "--provider", "docker", "--workspace", str(tmp_path / "ws"), "--",
                    PY, "probe.py", str(corral_home / "journals")), env, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[0])
    # (two while the exec that started it waits for its report: the same program)
    assert out["uid"] == 1000 and out["supervisors"] >= 1, out
    # no descriptor but its three pipes (the journal is the supervisor's)
    assert out["fds"] == ["0", "1", "2", "3"] and out["stdio_pipes"] == [True] * 3, out
    assert out["reached"] == [], out["reached"]
    # the OOM killer takes the agent before the supervisor
    assert out["oom_score_adj"] == "1000", out


def test_the_agents_commands_are_the_oom_killers_first_choice(env: dict[str, str]) -> None:
    r = run(_corral("exec", "--provider", "docker", "--", "cat", "/proc/self/oom_score_adj"),
            env, timeout=120)
    assert r.stdout == b"1000\n", (r.stdout, r.stderr)


def test_the_journal_dir_is_out_of_the_agents_reach(tmp_path: Path,
                                                   env: dict[str, str]) -> None:
    r = run(_corral("run", "--provider", "docker", "--workspace", str(_empty(tmp_path)),
                    "--", "sh", "-c", "ls /run/corral-private 2>&1; cat /run/corral-private/runs/*/journal 2>&1; "
                    "ls -l /proc/*/fd 2>/dev/null | grep -c journal; exit 0"), env, timeout=90)
    assert r.returncode == 0, r.stderr
    text = r.stdout.decode()
    assert "Permission denied" in text and text.rstrip().endswith("0"), text


@pytest.mark.timeout(300)
def test_filling_the_containers_memory_does_not_cut_the_host_off(
        tmp_path: Path, env: dict[str, str]) -> None:
    # Files in the container's tmpfs are charged to its memory limit and no OOM kill frees
    # them: /tmp filled to the limit left no memory for any exec, so the host could not
    # read the journal, stop the agent or see its end ("running" forever, past --timeout).
    cfg = _config(tmp_path, """
        [provider]
        name = "docker"
        limits = { memory = "128M" }
    """)
    r = run(_corral("run", "--config", str(cfg), "--timeout", "60", "--workspace",
                    str(_empty(tmp_path)), "--", "sh", "-c",
                    "head -c 200M /dev/zero > /tmp/fill; echo wrote $?; "
                    f"{PY} -c 'x = bytearray(300 << 20)'; echo hog $?; exit 3"),
            env, timeout=240)
    record = last_run(_corral(), env)
    assert record["status"] == "failed" and record["exit_code"] == 3, (record, r.stderr)
    assert b"wrote 1" in r.stdout  # /tmp is smaller than the memory limit
    assert b"hog 137" in r.stdout  # the agent's hog was the OOM killer's choice


# ------------------------------------------------- labels and volumes gc trusts


def _docker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120,
                          check=False)


@pytest.mark.anyio
async def test_a_forged_label_cannot_make_gc_destroy_another_sandbox(
        tmp_path: Path, env: dict[str, str]) -> None:
    from corral.sandbox._ensure import store_id
    from corral.stores import open_store

    url = f"sqlite://{tmp_path / 'corral.db'}"
    store = await open_store(url)
    provider = DockerProvider()
    victim = await provider.create()  # e.g. `corral exec --keep`: gc must never touch it
    forged = f"corral-forged-{os.getpid()}-{time.time_ns()}"
    try:
        ours = await store_id(store)
        assert ours
        # a container that is no sandbox of corral's, labelled as an orphan of this store
        # whose sandbox id is the victim's
        made = _docker("create", "--name", forged, "--label", "corral=1",
                       "--label", f"corral.sandbox={victim.id}", "--label", f"corral.store={ours}",
                       "--label", "corral.key=k-forged", "--label", "corral.created-at=0",
                       provider.image, "true")
        assert made.returncode == 0, made.stderr
        r = run(_corral("gc", "--store", url, "--json", "--orphan-grace", "0"), env)
        assert r.returncode == 0, r.stderr
        assert victim.id.encode() not in r.stdout, r.stdout
        assert (await victim.process.exec(["true"])).ok, "gc destroyed another sandbox"
        assert _docker("inspect", forged).returncode == 0  # nor the forger's container
    finally:
        _docker("rm", "-f", forged)
        await provider.destroy(victim.ref)
        await store.aclose()


def test_a_planted_volume_never_becomes_a_sandboxs_workspace(env: dict[str, str]) -> None:
    # Volumes are found by name: one made beforehand (by anyone who can reach the daemon,
    # or left by an earlier sandbox of the same name) would be mounted as is.
    name = f"planted-{os.getpid()}-{time.time_ns() % 10**6}"
    vol = volume_names(name)["/workspace"]
    made = _docker("volume", "create", vol)
    assert made.returncode == 0, made.stderr
    try:
        r = run(_corral("exec", "--provider", "docker", "--name", name, "--keep", "--",
                        "ls", "-A", "/workspace"), env)
        assert r.returncode != 0 and r.stdout == b"", (r.stdout, r.stderr)
        err = r.stderr.decode()
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert vol in err and "already exists" in err, err
        assert _docker("inspect", container_name(name)).returncode != 0
        assert _docker("volume", "inspect", vol).returncode == 0  # not ours to remove
    finally:
        _docker("rm", "-f", container_name(name))
        for v in volume_names(name).values():
            _docker("volume", "rm", "-f", v)


# ------------------------------------------------- mounts, the Docker socket, the host

MOUNTS = r"""
import json, os, socket, stat, sys
found, answered = [], []
for top in ("/",):
    for root, dirs, files in os.walk(top):
        if root in ("/proc", "/sys", "/dev"):
            dirs[:] = []
            continue
        for name in files + dirs:
            p = os.path.join(root, name)
            try:
                if stat.S_ISSOCK(os.lstat(p).st_mode) or name.endswith(".sock"):
                    found.append(p)
            except OSError:
                pass
for p in found + ["/run/corral/egress.sock"]:
    try:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(3)
        s.connect(p)
        s.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
        reply = s.recv(4096)
        if b"Docker" in reply or b"API-Version" in reply or reply.endswith(b"OK"):
            answered.append(p)
    except OSError:
        pass
mounts = [l.split(" - ")[0].split()[4:6] + l.split(" - ")[1].split()[:2]
          for l in open("/proc/self/mountinfo").read().splitlines()]
print(json.dumps({"found": found, "answered": answered, "mounts": mounts}))
"""


@pytest.fixture(scope="module")
def socket_dir() -> Iterator[Path]:
    """A run's socket directory as agent runs have it (not listable, one socket)."""
    d = Path(tempfile.mkdtemp(prefix="cdk-", dir="/tmp"))
    d.chmod(0o711)
    yield d
    for p in d.iterdir():
        p.unlink()
    d.rmdir()


@pytest.fixture(scope="module")
def egress(socket_dir: Path) -> Iterator[tuple[Path, HelloServer]]:
    """The real egress proxy on a unix socket in ``socket_dir`` (allowing ``localhost:*``
    and one loopback port named literally), and a service on the host's loopback."""
    from corral.net._egress import EgressProxy

    srv = HelloServer("127.0.0.1")
    sock = socket_dir / "egress.sock"
    proxy = EgressProxy(["localhost:*"])
    stop = threading.Event()

    async def serve() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(proxy.serve, str(sock))
            await anyio.to_thread.run_sync(stop.wait)
            tg.cancel_scope.cancel()

    thread = threading.Thread(target=anyio.run, args=(serve,), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert time.monotonic() < deadline, "the egress proxy did not start"
            time.sleep(0.02)
        sock.chmod(0o666)
        yield sock, srv
    finally:
        stop.set()
        thread.join(30)
        srv.stop()


@pytest.fixture(scope="module")
def agent_sandbox(socket_dir: Path, egress: tuple[Path, HelloServer],
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[DockerHandle]:
    """One sandbox for the module, made as for an agent run: the agents root and the
    socket directory bound read-only."""
    from corral.providers._docker import AGENTS_TARGET
    from tests.docker_support import docker_problem

    if docker_problem() is not None:
        pytest.skip(f"missing prerequisite: {docker_problem()}")
    agents = tmp_path_factory.mktemp("agents")
    agents.chmod(0o755)
    provider = DockerProvider()
    h = anyio.run(lambda: provider.create(SandboxSpec(
        binds=[(str(agents), AGENTS_TARGET), (str(socket_dir), "/run/corral")])))
    try:
        yield h
    finally:
        anyio.run(provider.destroy, h.ref)


def _exec(h: DockerHandle, argv: list[str], **kw: Any) -> Any:
    return anyio.run(lambda: h.process.exec(argv, **kw))


def test_no_mount_leads_to_the_docker_socket_or_the_host(agent_sandbox: DockerHandle,
                                                        socket_dir: Path) -> None:
    r = _exec(agent_sandbox, [PY, "-c", MOUNTS], timeout=120)
    assert r.ok, r
    out = json.loads(r.stdout)
    assert out["answered"] == [], out  # nothing speaks the Docker API
    # no socket the agent can find (the socket directory is not listable; its one socket,
    # named, is the egress proxy, tried above)
    assert out["found"] == [], out["found"]
    # [target, options, fstype, source]: the binds from the host are read-only, and no
    # mount is the Docker socket, containerd's, or the host's root
    binds = {m[0]: m[1].split(",") for m in out["mounts"]
             if m[0] in ("/run/corral", "/opt/corral/agents")}
    assert set(binds) == {"/run/corral", "/opt/corral/agents"}, out["mounts"]
    assert all("ro" in opts for opts in binds.values()), binds
    writable = sorted(m[0] for m in out["mounts"] if "rw" in m[1].split(",")
                      and not m[0].startswith(("/proc", "/sys", "/dev")))
    assert writable == ["/home/agent", "/run/corral-private", "/tmp", "/workspace"], writable
    for m in out["mounts"]:
        assert not any(word in " ".join(m) for word in ("docker.sock", "containerd")), m
    ro = _exec(agent_sandbox, ["sh", "-c", "touch /run/corral/x || touch /opt/corral/agents/x "
                               "|| mv /run/corral/egress.sock /tmp/ || echo refused"])
    assert ro.stdout.strip().endswith(b"refused"), ro
    assert [p.name for p in socket_dir.iterdir()] == ["egress.sock"]


EGRESS = r"""
import socket, sys
port = int(sys.argv[1])
def ask(target):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(20)
    s.connect("/run/corral/egress.sock")
    s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    return s.recv(4096).split(b"\r\n")[0].decode()
for t in (f"localhost:{port}", f"127.0.0.1:{port}", "169.254.169.254:80", "host.docker.internal:80",
          "172.17.0.1:2375", "[::1]:%d" % port):
    print(t, ask(t))
try:
    socket.create_connection(("127.0.0.1", port), timeout=3)
    print("direct connected")
except OSError:
    print("direct failed")
"""


def test_the_egress_proxy_leads_to_no_host_address(agent_sandbox: DockerHandle,
                                                   egress: tuple[Path, HelloServer]) -> None:
    _sock, srv = egress
    port = srv.server_address[1]
    r = _exec(agent_sandbox, [PY, "-c", EGRESS, str(port)], timeout=120)
    assert r.ok, r
    lines = r.stdout.decode().splitlines()
    assert lines[-1] == "direct failed", lines
    for line in lines[:-1]:
        assert " HTTP/1.1 403" in line, lines  # refused: not allowed, or not public
    assert srv.hits == 0  # type: ignore[attr-defined]


# ------------------------------------------------- secrets where the daemon keeps things


def test_no_secret_in_what_the_daemon_keeps_of_a_run(tmp_path: Path,
                                                     env: dict[str, str]) -> None:
    secret = "tok-" + os.urandom(12).hex()
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "token").write_text(secret)
    cfg = _config(tmp_path, f"""
        [secrets]
        API_TOKEN = {{ file = "{tmp_path / 'cfg' / 'token'}" }}
    """)
    run_id = f"insp-{os.getpid()}-{time.time_ns() % 10**6}"
    proc = subprocess.Popen(
        _corral("run", "--provider", "docker", "--config", str(cfg), "--run-id", run_id,
                "--workspace", str(_empty(tmp_path)),
                "--", "sh", "-c", 'test -n "$API_TOKEN" && echo ready; sleep 300'),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        api = DockerProvider().api

        def agent_started() -> bool:
            found = api.containers(filters={"label": f"corral.run={run_id}"})
            return bool(found) and any("sleep 300" in p[-1] for p in
                                       api.top(found[0]["Id"])["Processes"])

        wait_until(agent_started, "the run's agent to start", timeout=180, interval=0.2)
        found = api.containers(filters={"label": f"corral.run={run_id}"})
        info = api.inspect_container(found[0]["Id"])
        kept = [json.dumps(info), json.dumps(api.top(found[0]["Id"]))]
        for exec_id in info.get("ExecIDs") or []:
            try:
                kept.append(json.dumps(api.exec_inspect(exec_id)))
            except docker_errors().NotFound:
                pass  # an exec that ended since (the daemon forgets them)
        kept += [json.dumps(api.history(info["Image"]))]
        assert all(secret not in k for k in kept)
        assert len(kept) > 3  # the supervisor's exec and the journal reads were looked at
    finally:
        run(_corral("cancel", run_id), env)
        proc.wait(timeout=120)


# ------------------------------------------------- limits and gVisor


def test_a_disk_limit_is_refused_in_one_line(env: dict[str, str]) -> None:
    r = run(_corral("exec", "--provider", "docker", "--disk", "1G", "--", "true"), env)
    err = r.stderr.decode()
    assert r.returncode != 0 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and "disk" in err, err


def test_corral_doctor_says_whether_gvisor_is_there(env: dict[str, str]) -> None:
    runtimes = DockerProvider().api.info().get("Runtimes") or {}
    r = run(_corral("doctor"), env)
    line = next((ln for ln in r.stdout.decode().splitlines() if "gvisor" in ln.lower()), "")
    assert line, r.stdout
    if "runsc" in runtimes:
        assert "available" in line and "not" not in line, line
    else:
        assert "not available" in line and "runsc" in line, line


def test_under_gvisor_the_agent_cannot_reach_the_supervisor_either(
        tmp_path: Path, env: dict[str, str], corral_home: Path) -> None:
    if "runsc" not in (DockerProvider().api.info().get("Runtimes") or {}):
        pytest.skip("gVisor: no runsc runtime registered with this daemon "
                    "(corral doctor says so)")
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "probe.py").write_text(PROBE)
    cfg = _config(tmp_path, """
        [provider]
        name = "docker"
        runtime = "runsc"
    """)
    r = run(_corral("run", "--config", str(cfg), "--workspace", str(tmp_path / "ws"), "--",
                    PY, "probe.py", str(corral_home / "journals")), env, timeout=180)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[0])["reached"] == []
