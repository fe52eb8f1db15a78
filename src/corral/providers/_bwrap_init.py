"""The sandbox's pid 1 for bubblewrap commands, and where its program comes from.

Every ``exec``/``spawn`` runs under corral's init as pid 1 of a fresh pid namespace
(``bwrap --as-pid-1``). Its argv is ``REPORT_FD KEEPER_FD FILTER`` and nothing else; it
starts with an empty environment. In order, it

1. makes itself non-dumpable, so the command (same uid) can neither ptrace it nor open
   its ``/proc`` files or take its descriptors (``pidfd_getfd``); as a namespace's init
   it cannot be signalled from inside either;
2. installs FILTER (hex, or ``-``), a seccomp program that binds it and everything it
   starts (no btrfs subvolumes; bwrap has set no_new_privs);
3. closes KEEPER_FD (bwrap's status-pipe keeper, see the provider) and marks REPORT_FD
   close-on-exec, so the command holds neither;
4. reads what to run from the head of stdin (``launch_prefix``: the cwd, the environment
   and the argv, none of which is ever in a host process's environment or argv), byte by
   byte up to the length line, so nothing past the prefix is consumed;
5. forks and execs the command there (``execvp`` on the command's own ``PATH``; 127 when
   it is not found, 126 when it cannot run, with one line on stderr);
6. reaps every orphan until the command ends, writes the command's raw wait status on
   REPORT_FD (whose read end only the host holds) and exits with the shell's convention
   (``128 + N`` for a death by signal N). The kernel then kills whatever is left in the
   namespace, stopped or traced processes included.

Two programs implement this, with the same argv and behaviour:

* a small C program (:data:`C_SOURCE`), the default: it starts in well under a
  millisecond where ``perl`` takes ~3 ms per command (docs/benchmarks.md, "#17: a C
  init"). corral compiles it with the host's ``cc`` on first use and keeps the binary in
  a cache named by the source's hash: ``/var/lib/corral/init/`` when corral runs as root
  (root-owned, mode 0755; the sandboxes' unprivileged uid must reach it to bind it), or
  ``$CORRAL_HOME/init/`` otherwise. A cached binary is used only when it and every
  directory above it belong to root or to corral's own user and no other user can write
  them (group/other-writable or foreign-owned entries are rebuilt, or refused when the
  directory itself is not corral's); the build runs with a fixed environment in a private
  temporary directory, smoke-tests the result and renames it into place atomically. It is
  bound read-only into each sandbox at :data:`INSIDE_PATH`; the sandbox's uid owns
  nothing there, so it cannot replace it.
* the same logic as a ``perl -e`` script (:data:`PERL_INIT`), used when the host has no C
  compiler or the cache cannot be trusted. ``corral doctor`` says which one is in force
  and why.

As root, a second program is built and checked with the init (:data:`LAUNCH_SOURCE`,
``launch-<hash>``): the launcher that drops from root to the sandbox's host uid before
``bwrap`` (``setgroups(0)``, ``setresgid``, ``setresuid``, no_new_privs, a check that root
cannot be regained, then ``execv`` of an absolute path; uid or gid 0 refused). It replaces
``setpriv``, a dynamically linked program that is slower to start (bench/launcher_chain.py);
without a compiler ``setpriv`` is used as before.

The sandboxes' agent (:mod:`corral.providers._bwrap_agent`, source in
:mod:`corral.providers._agent_source`) is built, cached (``agent-<hash>``), checked and bound
read-only the same way, with the init: one key names all three programs.

Compiling at first use rather than at install time: corral is a pure-Python package
(wheels carry no binaries, and a wheel built elsewhere could not be checked against the
host's libc anyway); the host's own compiler and libc make a program that matches the
``/usr`` bound into every sandbox, and a host without a compiler still works.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from collections.abc import Callable

from corral._paths import SHARED_ROOT, corral_home
from corral.providers._agent_source import AGENT_SOURCE

__all__ = ["AGENT_INSIDE_PATH", "C_SOURCE", "INSIDE_PATH", "LAUNCH_SOURCE", "PERL_INIT", "InitProgram", "cache_dir", "find_init"]

INSIDE_PATH = "/run/corral-init"
"""Where the C init is bound (read-only) in every sandbox."""
AGENT_INSIDE_PATH = "/run/corral-agent"
"""Where the agent is bound (read-only) in a sandbox whose commands it runs."""

C_SOURCE = r"""/* corral's pid 1 for a bubblewrap command (see corral.providers._bwrap_init). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static int num(const char *s, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end) return -1;
  *out = v;
  return 0;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

static int readall(int fd, char *buf, size_t len) {
  size_t got = 0;
  while (got < len) {
    ssize_t r = read(fd, buf + got, len - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    got += (size_t)r;
  }
  return 0;
}

int main(int argc, char **argv) {
  long report, keeper;
  /* First: no ptrace, no /proc/1/{mem,fd,environ}, no pidfd_getfd by the command. */
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) return 125;
  if (argc != 4 || num(argv[1], &report) || num(argv[2], &keeper)) return 125;
  const char *filter = argv[3];
  if (strcmp(filter, "-") != 0) {
    size_t n = strlen(filter);
    if (n == 0 || n % 16) return 125;
    unsigned char *prog = malloc(n / 2);
    if (!prog) return 125;
    for (size_t i = 0; i < n / 2; i++) {
      int hi = hexval(filter[2 * i]), lo = hexval(filter[2 * i + 1]);
      if (hi < 0 || lo < 0) return 125;
      prog[i] = (unsigned char)(hi << 4 | lo);
    }
    struct sock_fprog fprog = {.len = (unsigned short)(n / 16), .filter = (struct sock_filter *)prog};
    /* bwrap set no_new_privs; the filter binds this process and all it starts. */
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fprog, 0, 0) != 0) return 125;
    free(prog);
  }
  if (keeper >= 0) close((int)keeper);
  if (report >= 0 && fcntl((int)report, F_SETFD, FD_CLOEXEC) != 0) return 125;

  /* The head of stdin: "<length>\n" then NUL-terminated fields; read byte by byte up to
     the newline so that nothing past the prefix is consumed (it is the command's). */
  size_t len = 0;
  int digits = 0;
  for (;;) {
    char c;
    ssize_t r = read(0, &c, 1);
    if (r < 0 && errno == EINTR) continue;
    if (r != 1) return 125;
    if (c == '\n') break;
    if (c < '0' || c > '9' || ++digits > 9) return 125;
    len = len * 10 + (size_t)(c - '0');
  }
  if (!digits || !len) return 125;
  char *blob = malloc(len + 1);
  if (!blob || readall(0, blob, len)) return 125;
  blob[len] = '\0';
  if (blob[len - 1] != '\0') return 125;
  size_t nf = 0;
  for (size_t i = 0; i < len; i++) nf += blob[i] == '\0';
  char **f = calloc(nf + 1, sizeof(char *));
  if (!f) return 125;
  for (size_t i = 0, k = 0; k < nf; k++) {
    f[k] = blob + i;
    i += strlen(blob + i) + 1;
  }
  long nenv;
  if (nf < 2 || num(f[1], &nenv) || nenv < 0 || (size_t)nenv > nf - 2) return 125;
  const char *cwd = f[0];
  char **env = f + 2;
  char **args = env + nenv;
  size_t nargs = nf - 2 - (size_t)nenv;
  if (nargs == 0) return 125;
  /* env and argv are each NULL-terminated in place: env's end is argv's start, so copy. */
  char **envp = calloc((size_t)nenv + 1, sizeof(char *));
  if (!envp) return 125;
  memcpy(envp, env, (size_t)nenv * sizeof(char *));

  pid_t pid = fork();
  if (pid < 0) {
    dprintf(2, "corral: cannot start %s: fork: %s\n", args[0], strerror(errno));
    return 126;
  }
  if (pid == 0) {
    if (chdir(cwd) != 0) {
      dprintf(2, "corral: cannot enter %s: %s\n", cwd, strerror(errno));
      _exit(126);
    }
    environ = envp; /* execvp searches the command's own PATH */
    execvp(args[0], args);
    int e = errno;
    dprintf(2, "corral: %s: %s\n", args[0], strerror(e));
    _exit(e == ENOENT ? 127 : 126);
  }
  /* Reap every orphan until the command itself ends. */
  int s = 255 << 8;
  for (;;) {
    int st;
    pid_t w = waitpid(-1, &st, 0);
    if (w < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (w == pid) {
      s = st;
      break;
    }
  }
  if (report >= 0) {
    char line[16];
    int n = snprintf(line, sizeof line, "%d\n", s);
    ssize_t wr;
    do wr = write((int)report, line, (size_t)n); while (wr < 0 && errno == EINTR);
  }
  return (s & 127) ? 128 + (s & 127) : (s >> 8) & 255;
}
"""

# The same, for hosts without a C compiler: prctl through perl's syscall() (its number per
# machine is the 5th argument, after the three above).
PERL_INIT = r"""
my ($fd, $keeper, $filter, $nr) = splice(@ARGV, 0, 4);
syscall($nr, 4, 0, 0, 0, 0) == 0 or exit 125;
if ($filter ne "-") {
  # prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &sock_fprog); bwrap set no_new_privs
  my $prog = pack("H*", $filter);
  syscall($nr, 22, 2, pack("S x![P] P", length($prog) / 8, $prog), 0, 0) == 0 or exit 125;
}
if ($keeper >= 0) { open(my $k, "<&=", $keeper) and close($k) }
my $st;
if ($fd >= 0) { open($st, ">&=", $fd) or exit 125 }
my ($len, $c, $blob) = ("", "", "");
while (1) { sysread(STDIN, $c, 1) == 1 or exit 125; last if $c eq "\n"; $len .= $c }
while (length($blob) < $len) {
  my $r = sysread(STDIN, $blob, $len - length($blob), length($blob));
  defined($r) && $r > 0 or exit 125;
}
my @f = split(/\0/, $blob, -1);
pop @f;
my ($cwd, $n) = splice(@f, 0, 2);
my @env = splice(@f, 0, $n);
my @argv = @f;
@argv or exit 125;
my $pid = fork;
if (!defined $pid) { print STDERR "corral: cannot start $argv[0]: fork: $!\n"; exit 126 }
if ($pid == 0) {
  close $st if $st;
  chdir($cwd) or do { print STDERR "corral: cannot enter $cwd: $!\n"; exit 126 };
  %ENV = map { split(/=/, $_, 2) } @env;
  exec { $argv[0] } @argv;
  my $e = $! + 0;
  print STDERR "corral: $argv[0]: $!\n";
  exit($e == 2 ? 127 : 126);
}
my $s = 255 << 8;
while ((my $w = waitpid(-1, 0)) > 0) { if ($w == $pid) { $s = $?; last } }
syswrite $st, "$s\n" if $st;
exit(($s & 127) ? 128 + ($s & 127) : $s >> 8);
"""

LAUNCH_SOURCE = r"""/* corral's launcher (see corral.providers._bwrap_init): as root, drop to the sandbox's
   host uid and gid, no supplementary groups, no_new_privs, then exec the program.
   argv: UID GID PROGRAM [ARG...] (PROGRAM an absolute path). Replaces setpriv. */
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

static int id(const char *s, unsigned long *out) {
  char *end;
  errno = 0;
  unsigned long v = strtoul(s, &end, 10);
  if (errno || end == s || *end || *s == '-' || v == 0 || v >= 0xFFFFFFFFul) return -1;
  *out = v;
  return 0;
}

int main(int argc, char **argv) {
  unsigned long uid, gid;
  if (argc < 4 || id(argv[1], &uid) || id(argv[2], &gid) || argv[3][0] != '/') {
    fprintf(stderr, "corral-launch: usage: UID GID /PROGRAM [ARG...]\n");
    return 125;
  }
  /* Groups first (needs root), then the gid, then the uid: after that, no way back. */
  if (setgroups(0, NULL) || setresgid((gid_t)gid, (gid_t)gid, (gid_t)gid) ||
      setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) {
    fprintf(stderr, "corral-launch: cannot drop to uid %lu: %s\n", uid, strerror(errno));
    return 125;
  }
  if (setresuid(0, 0, 0) == 0 || getgroups(0, NULL) != 0) return 125; /* really dropped */
  execv(argv[3], argv + 3);
  fprintf(stderr, "corral-launch: %s: %s\n", argv[3], strerror(errno));
  return errno == ENOENT ? 127 : 126;
}
"""

_KEY = hashlib.sha256((C_SOURCE + LAUNCH_SOURCE + AGENT_SOURCE).encode()).hexdigest()[:16]
_FIXED_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}


@dataclass(frozen=True)
class InitProgram:
    """Which init a provider runs: ``kind`` ``"c"`` (``path`` is the cached binary on the
    host) or ``"perl"``; ``reason`` says why, for ``corral doctor``. ``launcher`` (as root,
    with the C init) is the cached program that replaces ``setpriv``; ``agent`` (with the C
    init) the in-sandbox agent (:mod:`corral.providers._bwrap_agent`)."""

    kind: Literal["c", "perl"]
    path: Path | None
    reason: str
    launcher: Path | None = None
    agent: Path | None = None


def cache_dir() -> Path:
    """Where the compiled init is kept: corral's shared root when running as root (the
    sandboxes' host uid must reach it), else ``$CORRAL_HOME/init``."""
    return SHARED_ROOT / "init" if os.geteuid() == 0 else corral_home() / "init"


_found: dict[Path, InitProgram] = {}


def find_init(directory: Path | None = None, *, prefer: Literal["auto", "perl"] = "auto") -> InitProgram:
    """The init to use: the cached C init (built now if missing), else perl. Once per
    process and directory."""
    if prefer == "perl":
        return InitProgram("perl", None, "perl asked for")
    directory = directory or cache_dir()
    found = _found.get(directory)
    # Built or checked once per process; found again if removed meanwhile (a cleaned
    # /var/lib under a long-running server): a stat per call, no more.
    if found is None or any(p is not None and not p.exists()
                            for p in (found.path, found.launcher, found.agent)):
        found = _found[directory] = _find(directory)
    return found


def _find(directory: Path) -> InitProgram:
    root = os.geteuid() == 0
    try:
        directory.parent.mkdir(mode=0o711, parents=True, exist_ok=True)
        directory.mkdir(mode=0o755, exist_ok=True)
    except OSError as exc:
        return InitProgram("perl", None, f"cannot make the init cache {directory}: {exc.strerror}")
    problem = untrusted(directory, reachable=root)
    if problem:
        return InitProgram("perl", None, f"the init cache is not safe to use: {problem}")
    binary, launcher = directory / f"init-{_KEY}", directory / f"launch-{_KEY}"
    agent = directory / f"agent-{_KEY}"
    # Checked once per process, before anything of it runs: ours, and it still works here
    # (a filesystem remounted noexec, a libc upgrade under a dynamic build).
    if (_usable(binary, _smoke) and _usable(agent, _smoke_agent)
            and (not root or _usable(launcher, _smoke_launcher))):
        return InitProgram("c", binary, f"compiled C init {binary}", launcher if root else None,
                           agent)
    error = _build(directory, binary, launcher if root else None, agent)
    if error:
        return InitProgram("perl", None, error)
    return InitProgram("c", binary, f"compiled C init {binary} (built now)",
                       launcher if root else None, agent)


def _usable(path: Path, smoke: Callable[[Path], bool]) -> bool:
    """Whether the cached ``path`` can be run; anything else there is removed."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if _safe_file(st) and smoke(path):  # never run a file that is not ours
        return True
    path.unlink()  # not ours any more (another owner, writable, a link) or broken
    return False


def _safe_file(st: os.stat_result) -> bool:
    return (
        stat.S_ISREG(st.st_mode)
        and st.st_uid in (0, os.geteuid())
        and not st.st_mode & 0o022
        and bool(st.st_mode & 0o001 or os.geteuid() != 0)
    )


def untrusted(path: Path, *, reachable: bool) -> str | None:
    """Why ``path`` (a directory) could be changed by someone other than root or this
    user, or None. Each directory from ``/`` down must belong to root or to this user and
    be writable by no one else (a sticky directory such as ``/tmp`` is fine above it:
    nobody else can rename what is in it). ``reachable``: each must also let other users
    through (the sandboxes' host uid binds the init from there)."""
    real = Path(os.path.realpath(path))
    chain = [*reversed(real.parents), real]
    for i, d in enumerate(chain):
        st = os.lstat(d)
        if st.st_uid not in (0, os.geteuid()):
            return f"{d} belongs to uid {st.st_uid}"
        sticky_above = st.st_mode & stat.S_ISVTX and i < len(chain) - 1
        if st.st_mode & 0o022 and not sticky_above:
            return f"{d} is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
        if reachable and not st.st_mode & 0o001:
            return f"{d} cannot be entered by the sandboxes' uid (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _build(directory: Path, binary: Path, launcher: Path | None, agent: Path) -> str | None:
    cc = next((p for p in map(shutil.which, ("cc", "gcc", "clang")) if p), None)
    if cc is None:
        return "no C compiler on PATH (apt-get install gcc): using the perl init"
    wanted = [(C_SOURCE, binary, _smoke), (AGENT_SOURCE, agent, _smoke_agent)]
    if launcher is not None:
        wanted.append((LAUNCH_SOURCE, launcher, _smoke_launcher))
    with tempfile.TemporaryDirectory(dir=directory, prefix=".build-") as tmp:
        built = []
        for source, dest, smoke in wanted:
            src = Path(tmp) / f"{dest.name}.c"
            src.write_text(source)
            out = Path(tmp) / dest.name
            why = ""
            for extra in (["-static"], []):  # static starts faster; not every host has libc.a
                try:
                    done = subprocess.run(
                        [cc, "-O2", *extra, "-o", str(out), str(src)],
                        cwd=tmp, env=_FIXED_ENV, capture_output=True, timeout=120, check=False,
                    )
                except (OSError, subprocess.TimeoutExpired) as exc:
                    why = str(exc)
                    continue
                if done.returncode == 0:
                    os.chmod(out, 0o755)
                    if smoke(out):
                        break
                    why = "the program it built does not work"
                else:
                    why = (done.stderr.decode(errors="replace").strip().splitlines()
                           or ["no output"])[-1]
            else:
                return f"could not compile the C init with {cc} ({why}): using the perl init"
            built.append((out, dest))
        for out, dest in built:  # the launcher last: it is only used with its init
            os.rename(out, dest)
    return None


def _smoke_agent(program: Path) -> bool:
    """The fresh agent must run here: without its arguments it refuses with 125 (the real
    check is its hello, at each sandbox's first command)."""
    try:
        done = subprocess.run([str(program)], env=_FIXED_ENV, capture_output=True, timeout=30,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 125


def _smoke_launcher(program: Path) -> bool:
    """The fresh launcher must drop to another uid (no groups, no_new_privs) and exec."""
    script = ('[ "$(id -u):$(id -g):$(id -G)" = "65534:65534:65534" ] && '
              'grep -q "^NoNewPrivs:.*1" /proc/self/status && exit 7')
    try:
        done = subprocess.run([str(program), "65534", "65534", "/bin/sh", "-c", script],
                              env=_FIXED_ENV, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 7


def _smoke(program: Path) -> bool:
    """Run the fresh binary once on the host: ``sh -c 'exit 7'`` must report status 7."""
    blob = b"".join(f.encode() + b"\0" for f in ["/", "1", f"PATH={_FIXED_ENV['PATH']}",
                                                   "sh", "-c", "exit 7"])
    r, w = os.pipe()
    try:
        done = subprocess.run([str(program), str(w), "-1", "-"], input=str(len(blob)).encode()
                              + b"\n" + blob, env={}, pass_fds=(w,), capture_output=True,
                              timeout=30, check=False)
        os.close(w)
        w = -1
        return done.returncode == 7 and os.read(r, 64) == f"{7 << 8}\n".encode()
    except (OSError, subprocess.TimeoutExpired):
        return False
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
