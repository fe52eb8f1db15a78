"""Start a local command directly inside its sandbox's cgroup (``clone3`` with
``CLONE_INTO_CGROUP``), instead of starting it and moving it there.

Why: moving a process between cgroups takes the kernel's ``cgroup_threadgroup_rwsem``
for writing, and when no move happened for a moment that first waits for an RCU grace
period (~2 ms on a quiet machine, ~11 ms under load). A local ``ensure`` or an ``exec``
after a pause paid it on every command. A child created in the group is a fork, which
takes that lock only for reading: no wait, and no moment where the child runs outside
the group (so no race with a command that forks right away).

Python cannot create a child with ``clone3`` itself, so a small C function
(:data:`C_SOURCE`) does the part between the clone and the ``execve``: new session,
pipes on 0/1/2, every other descriptor close-on-exec, cwd, default signal handlers,
``PATH`` candidates in order. It touches no Python object and allocates nothing, as
``_posixsubprocess`` does. :class:`InGroupPopen` is a real :class:`subprocess.Popen`
(wait, poll, reaping, exec errors raised as ``FileNotFoundError``/``PermissionError``)
whose start goes through that function.

The library is compiled with the host's ``cc`` on first use and cached next to the
bubblewrap init (same cache directory, same trust rules: see ``_bwrap_init``), named by
the hash of its source; it is loaded only after a smoke test in a child process. Without
a compiler, without ``clone3`` (an old kernel, a seccomp filter) or on a Python whose
``Popen`` internals differ, :func:`spawner` returns None and the local provider moves
the child as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from corral.providers._bwrap_init import cache_dir, untrusted
from corral.providers._cgroups import GroupGone

__all__ = ["C_SOURCE", "CloneRefused", "InGroupPopen", "Spawner", "reason", "spawner"]

C_SOURCE = r"""/* corral: start a child inside a cgroup (see corral.providers._cgspawn). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef CLONE_INTO_CGROUP
#define CLONE_INTO_CGROUP 0x200000000ULL
#endif
#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#define CLOSE_RANGE_CLOEXEC_ (1U << 2)

static void report(int fd, int stage, int err) {
  int msg[2] = {stage, err};
  ssize_t r;
  do r = write(fd, msg, sizeof msg); while (r < 0 && errno == EINTR);
  _exit(127);
}

/* Only what is safe after a fork of a threaded process: plain system calls. */
static void child(char *const *paths, char *const *argv, char *const *envp, const char *cwd,
                  int in, int out, int err, int errfd, const sigset_t *mask) {
  int fds[3] = {in, out, err};
  for (int i = 0; i < 3; i++) /* out of 0..2 first, so no dup2 below clobbers another */
    if (fds[i] >= 0 && fds[i] < 3 && (fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 3)) < 0)
      report(errfd, 1, errno);
  for (int i = 0; i < 3; i++)
    if (fds[i] >= 0 && dup2(fds[i], i) < 0) report(errfd, 1, errno);
  if (setsid() < 0) report(errfd, 1, errno);
  if (syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC_) != 0) {
    struct rlimit rl;
    long top = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                   ? (long)rl.rlim_cur : 65536;
    for (long fd = 3; fd < top; fd++) fcntl((int)fd, F_SETFD, FD_CLOEXEC);
  }
  if (cwd && chdir(cwd) < 0) report(errfd, 2, errno);
  /* The parent's handlers (Python's) must not run here; SIGPIPE and SIGXFSZ, which
     Python ignores, go back to their defaults as subprocess does. */
  for (int sig = 1; sig < NSIG; sig++) {
    struct sigaction sa;
    if (sigaction(sig, NULL, &sa) != 0) continue;
    if (sig == SIGPIPE || sig == SIGXFSZ || (sa.sa_handler != SIG_IGN && sa.sa_handler != SIG_DFL)) {
      memset(&sa, 0, sizeof sa);
      sa.sa_handler = SIG_DFL;
      sigaction(sig, &sa, NULL);
    }
  }
  sigprocmask(SIG_SETMASK, mask, NULL);
  int first = 0;
  for (int i = 0; paths[i]; i++) {
    execve(paths[i], argv, envp);
    if (errno != ENOENT && errno != ENOTDIR && first == 0) first = errno;
  }
  report(errfd, 3, first ? first : errno);
}

struct job {
  char *const *paths, *const *argv, *const *envp;
  const char *cwd;
  int in, out, err, errfd;
  sigset_t mask;
};

static void run(void *p) {
  struct job *j = p;
  child(j->paths, j->argv, j->envp, j->cwd, j->in, j->out, j->err, j->errfd, &j->mask);
}

#if defined(__x86_64__)
/* clone3 with CLONE_VM|CLONE_VFORK, as vfork: the child borrows our memory on its own
   stack while we wait for its exec, so nothing (page tables, copy-on-write faults of the
   parent's heap) is copied. The child starts with only a stack pointer, hence assembly. */
static long clone3_vm(struct clone_args *a, void (*fn)(void *), void *arg) {
  long ret;
  register long r10 __asm__("r10") = (long)fn;
  register long r8 __asm__("r8") = (long)arg;
  __asm__ volatile(
      "syscall\n\t"
      "test %%rax, %%rax\n\t"
      "jnz 1f\n\t"
      "xor %%ebp, %%ebp\n\t"
      "mov %%r8, %%rdi\n\t"
      "call *%%r10\n\t"
      "mov $231, %%eax\n\t" /* exit_group(127): run never returns, but be sure */
      "mov $127, %%edi\n\t"
      "syscall\n\t"
      "hlt\n"
      "1:\n\t"
      : "=a"(ret)
      : "a"((long)SYS_clone3), "D"(a), "S"(sizeof *a), "r"(r10), "r"(r8)
      : "rcx", "r11", "memory");
  return ret;
}
#define HAVE_VM 1
#endif

/* Returns the child's pid, or -errno. cgroup_fd < 0: no cgroup (the smoke test). */
long corral_spawn(int cgroup_fd, char *const *paths, char *const *argv, char *const *envp,
                  const char *cwd, int in, int out, int err, int errfd) {
  struct clone_args args;
  struct job job = {paths, argv, envp, cwd, in, out, err, errfd};
  sigset_t all;
  long pid;
  memset(&args, 0, sizeof args);
  args.exit_signal = SIGCHLD;
  if (cgroup_fd >= 0) {
    args.flags = CLONE_INTO_CGROUP;
    args.cgroup = (uint64_t)cgroup_fd;
  }
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &job.mask); /* no handler of ours runs in the child */
#ifdef HAVE_VM
  /* Its stack is ours: we are suspended until it has exec'd or exited. */
  char stack[32768] __attribute__((aligned(16)));
  args.flags |= CLONE_VM | CLONE_VFORK;
  args.stack = (uint64_t)(uintptr_t)stack;
  args.stack_size = sizeof stack;
  pid = clone3_vm(&args, run, &job);
  if (pid < 0) errno = (int)-pid, pid = -1;
#else
  pid = syscall(SYS_clone3, &args, sizeof args);
  if (pid == 0) run(&job);
#endif
  int saved = errno;
  pthread_sigmask(SIG_SETMASK, &job.mask, NULL);
  return pid < 0 ? -saved : pid;
}
"""

_KEY = hashlib.sha256(C_SOURCE.encode()).hexdigest()[:16]
_FIXED_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
_STAGE_CWD = 2


class CloneRefused(OSError):
    """``clone3`` failed: no child was made (``ENOSYS``: not on this kernel or under this
    seccomp filter; ``ENODEV`` is raised as :class:`GroupGone` instead)."""


_CArgv = Any  # a ctypes array of char pointers


def _cargv(items: Sequence[bytes]) -> _CArgv:
    return (ctypes.c_char_p * (len(items) + 1))(*items, None)


class Spawner:
    """The loaded library: one call starts one child."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        fn = lib.corral_spawn
        fn.restype = ctypes.c_long
        fn.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                       ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int)
        self._fn = fn

    def start(self, cgroup_fd: int, paths: Sequence[bytes], argv: Sequence[bytes],
              envp: Sequence[bytes], cwd: bytes | None, fds: tuple[int, int, int],
              errfd: int) -> int:
        """The child's pid; OSError when it could not be created."""
        pid = int(self._fn(cgroup_fd, _cargv(paths), _cargv(argv), _cargv(envp), cwd, *fds, errfd))
        if pid < 0:
            raise CloneRefused(-pid, os.strerror(-pid))
        return pid


class InGroupPopen(subprocess.Popen[bytes]):
    """A :class:`subprocess.Popen` whose child starts inside a cgroup, in its own session.

    Give it ``cgroup_fd`` (an open directory of the group) and the arguments the local
    provider's ``popen`` gives; ``executable``, ``preexec_fn``, ``pass_fds``, user and
    group changes are not supported. Raises :class:`GroupGone` when the group is dead.
    """

    def __init__(self, argv: Sequence[str], *, spawner: Spawner, cgroup_fd: int,
                 env: Mapping[str, str], cwd: str | None) -> None:
        self._spawner = spawner
        self._cgroup_fd = cgroup_fd
        super().__init__(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=dict(env), cwd=cwd,
                         start_new_session=True, bufsize=0)

    def _execute_child(self, args: Any, executable: Any, preexec_fn: Any, close_fds: Any,
                       pass_fds: Any, cwd: Any, env: Any, startupinfo: Any, creationflags: Any,
                       shell: Any, p2cread: int, p2cwrite: int, c2pread: int, c2pwrite: int,
                       errread: int, errwrite: int, *rest: Any) -> None:
        args = list(args)
        sys.audit("subprocess.Popen", args[0], args, cwd, env)
        exe = os.fsencode(args[0])
        paths = ([exe] if os.path.dirname(exe)
                 else [os.path.join(os.fsencode(d), exe) for d in os.get_exec_path(env)])
        envp = []
        for k, v in env.items():
            key = os.fsencode(k)
            if b"=" in key:
                raise ValueError("illegal environment variable name")
            envp.append(key + b"=" + os.fsencode(v))
        errpipe_read, errpipe_write = os.pipe()
        try:
            try:
                self.pid = self._spawner.start(
                    self._cgroup_fd, paths, [os.fsencode(a) for a in args], envp,
                    None if cwd is None else os.fsencode(cwd), (p2cread, c2pwrite, errwrite),
                    errpipe_write)
            except CloneRefused as exc:
                if exc.errno in (errno.ENODEV, errno.ENOENT):  # a dead group
                    raise GroupGone(f"cgroup fd {self._cgroup_fd}") from None
                raise
            finally:
                os.close(errpipe_write)
            self._child_created = True
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)  # type: ignore[attr-defined]
            data = b""
            while len(data) < 8:
                part = os.read(errpipe_read, 8 - len(data))
                if not part:
                    break
                data += part
        finally:
            os.close(errpipe_read)
        if data:
            with contextlib.suppress(ChildProcessError):
                pid, status = os.waitpid(self.pid, 0)
                if pid == self.pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
            stage = int.from_bytes(data[:4], sys.byteorder)
            code = int.from_bytes(data[4:8], sys.byteorder)
            raise OSError(code, os.strerror(code), cwd if stage == _STAGE_CWD else args[0])


# -------------------------------------------------------------------- build and cache

_found: dict[Path, Spawner | None] = {}
_reason: dict[Path, str] = {}


def _popen_fits() -> bool:
    """This Popen's start hook still takes the arguments we override (3.11 to 3.13)."""
    try:
        code = subprocess.Popen._execute_child.__code__  # type: ignore[attr-defined]
    except AttributeError:
        return False
    names = list(code.co_varnames[: code.co_argcount])
    want = ["self", "args", "executable", "preexec_fn", "close_fds", "pass_fds", "cwd", "env",
            "startupinfo", "creationflags", "shell", "p2cread", "p2cwrite", "c2pread",
            "c2pwrite", "errread", "errwrite"]
    return names[: len(want)] == want and hasattr(subprocess.Popen, "_close_pipe_fds")


def spawner(directory: Path | None = None) -> Spawner | None:
    """The in-group spawner (built now if missing), or None where it cannot be used.
    Once per process and directory."""
    directory = directory or cache_dir()
    if directory not in _found:
        _found[directory], _reason[directory] = _find(directory)
    return _found[directory]


def reason(directory: Path | None = None) -> str:
    """Why :func:`spawner` gives what it gives (for ``corral doctor`` and tests)."""
    directory = directory or cache_dir()
    spawner(directory)
    return _reason[directory]


def _find(directory: Path) -> tuple[Spawner | None, str]:
    if sys.platform != "linux" or not _popen_fits():
        return None, "not Linux, or this Python's subprocess differs"
    try:
        directory.parent.mkdir(mode=0o711, parents=True, exist_ok=True)
        directory.mkdir(mode=0o755, exist_ok=True)
    except OSError as exc:
        return None, f"cannot make the cache {directory}: {exc.strerror}"
    problem = untrusted(directory, reachable=False)
    if problem:
        return None, f"the cache is not safe to use: {problem}"
    lib = directory / f"cgspawn-{_KEY}.so"
    # A cached library is only checked for ownership (loading it is the check that it
    # still links here); a fresh build is smoke-tested in a child process first.
    if not _ours(lib):
        error = _build(directory, lib)
        if error:
            return None, error
    try:
        return Spawner(ctypes.CDLL(str(lib))), f"compiled {lib}"
    except (OSError, AttributeError) as exc:
        return None, f"cannot load {lib}: {exc}"


def _ours(path: Path) -> bool:
    """Whether the cached ``path`` belongs to root or us and nobody else can write it;
    anything else there is removed."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISREG(st.st_mode) and st.st_uid in (0, os.geteuid()) and not st.st_mode & 0o022:
        return True
    path.unlink()
    return False


def _build(directory: Path, lib: Path) -> str | None:
    cc = next((p for p in map(shutil.which, ("cc", "gcc", "clang")) if p), None)
    if cc is None:
        return "no C compiler on PATH"
    with tempfile.TemporaryDirectory(dir=directory, prefix=".build-") as tmp:
        src, out = Path(tmp) / "cgspawn.c", Path(tmp) / lib.name
        src.write_text(C_SOURCE)
        try:
            done = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(out), str(src)],
                                  cwd=tmp, env=_FIXED_ENV, capture_output=True, timeout=120,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"could not compile the spawner with {cc} ({exc})"
        if done.returncode != 0:
            last = (done.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
            return f"could not compile the spawner with {cc} ({last})"
        os.chmod(out, 0o755)
        if not _smoke(out):
            return "the spawner it built does not work here (clone3 refused?)"
        os.rename(out, lib)
    return None


_SMOKE = r"""
import ctypes, os, subprocess, sys
sys.path[:0] = sys.argv[2:]
from corral.providers._cgspawn import InGroupPopen, Spawner
p = InGroupPopen(["sh", "-c", "read x; echo $x; exit 7"], spawner=Spawner(ctypes.CDLL(sys.argv[1])),
                 cgroup_fd=-1, env={"PATH": os.defpath}, cwd="/")
out, _ = p.communicate(b"ok\n")
try:
    InGroupPopen(["/nonexistent/x"], spawner=p._spawner, cgroup_fd=-1, env={}, cwd=None)
except FileNotFoundError:
    sys.exit(0 if (p.returncode, out) == (7, b"ok\n") else 1)
sys.exit(2)
"""


def _smoke(lib: Path) -> bool:
    """Load and use the library in a child Python first: a broken one must not crash us."""
    here = str(Path(__file__).resolve().parents[2])
    try:
        done = subprocess.run([sys.executable, "-I", "-c", _SMOKE, str(lib), here],
                              env=_FIXED_ENV, capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0
