"""The C source of corral's in-sandbox agent (see :mod:`corral.providers._bwrap_agent`).

Built and cached with the init by :mod:`corral.providers._bwrap_init`; its wire protocol
is described in :mod:`corral.providers._agent_client`.
"""

__all__ = ["AGENT_SOURCE"]

AGENT_SOURCE = r"""/* corral's in-sandbox agent (see corral.providers._bwrap_agent and _agent_client). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/uio.h>
#include <time.h>
#include <sys/stat.h>
#include <dirent.h>
#include <grp.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* ---- SHA-256 / HMAC (the hello: the host proves it holds this agent's key) ---- */
typedef struct { uint32_t h[8]; uint64_t n; unsigned char b[64]; size_t bl; } sha_t;
static const uint32_t K[64] = {
  0x428a2f98,0x71374491,0xb5c0fbcf,0xe9b5dba5,0x3956c25b,0x59f111f1,0x923f82a4,0xab1c5ed5,
  0xd807aa98,0x12835b01,0x243185be,0x550c7dc3,0x72be5d74,0x80deb1fe,0x9bdc06a7,0xc19bf174,
  0xe49b69c1,0xefbe4786,0x0fc19dc6,0x240ca1cc,0x2de92c6f,0x4a7484aa,0x5cb0a9dc,0x76f988da,
  0x983e5152,0xa831c66d,0xb00327c8,0xbf597fc7,0xc6e00bf3,0xd5a79147,0x06ca6351,0x14292967,
  0x27b70a85,0x2e1b2138,0x4d2c6dfc,0x53380d13,0x650a7354,0x766a0abb,0x81c2c92e,0x92722c85,
  0xa2bfe8a1,0xa81a664b,0xc24b8b70,0xc76c51a3,0xd192e819,0xd6990624,0xf40e3585,0x106aa070,
  0x19a4c116,0x1e376c08,0x2748774c,0x34b0bcb5,0x391c0cb3,0x4ed8aa4a,0x5b9cca4f,0x682e6ff3,
  0x748f82ee,0x78a5636f,0x84c87814,0x8cc70208,0x90befffa,0xa4506ceb,0xbef9a3f7,0xc67178f2};
#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))
static void sha_block(sha_t *s, const unsigned char *p) {
  uint32_t w[64], a, b, c, d, e, f, g, h;
  for (int i = 0; i < 16; i++) w[i] = (uint32_t)p[4*i] << 24 | (uint32_t)p[4*i+1] << 16 | (uint32_t)p[4*i+2] << 8 | p[4*i+3];
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = ROR(w[i-15], 7) ^ ROR(w[i-15], 18) ^ (w[i-15] >> 3);
    uint32_t s1 = ROR(w[i-2], 17) ^ ROR(w[i-2], 19) ^ (w[i-2] >> 10);
    w[i] = w[i-16] + s0 + w[i-7] + s1;
  }
  a = s->h[0]; b = s->h[1]; c = s->h[2]; d = s->h[3]; e = s->h[4]; f = s->h[5]; g = s->h[6]; h = s->h[7];
  for (int i = 0; i < 64; i++) {
    uint32_t t1 = h + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
    uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    h = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
  }
  s->h[0] += a; s->h[1] += b; s->h[2] += c; s->h[3] += d; s->h[4] += e; s->h[5] += f; s->h[6] += g; s->h[7] += h;
}
static void sha_init(sha_t *s) {
  static const uint32_t iv[8] = {0x6a09e667,0xbb67ae85,0x3c6ef372,0xa54ff53a,0x510e527f,0x9b05688c,0x1f83d9ab,0x5be0cd19};
  memcpy(s->h, iv, sizeof iv); s->n = 0; s->bl = 0;
}
static void sha_add(sha_t *s, const unsigned char *p, size_t len) {
  s->n += len;
  while (len) {
    size_t k = 64 - s->bl < len ? 64 - s->bl : len;
    memcpy(s->b + s->bl, p, k); s->bl += k; p += k; len -= k;
    if (s->bl == 64) { sha_block(s, s->b); s->bl = 0; }
  }
}
static void sha_end(sha_t *s, unsigned char out[32]) {
  uint64_t bits = s->n * 8;
  unsigned char pad = 0x80, z = 0, lb[8];
  sha_add(s, &pad, 1);
  while (s->bl != 56) sha_add(s, &z, 1);
  for (int i = 0; i < 8; i++) lb[i] = (unsigned char)(bits >> (56 - 8 * i));
  sha_add(s, lb, 8);
  for (int i = 0; i < 8; i++) { out[4*i] = s->h[i] >> 24; out[4*i+1] = s->h[i] >> 16; out[4*i+2] = s->h[i] >> 8; out[4*i+3] = s->h[i]; }
}
static void hmac(const unsigned char *key, size_t klen, const unsigned char *msg, size_t mlen, unsigned char out[32]) {
  unsigned char k[64] = {0}, ip[64], op[64], inner[32];
  sha_t s;
  if (klen > 64) { sha_init(&s); sha_add(&s, key, klen); sha_end(&s, k); } else memcpy(k, key, klen);
  for (int i = 0; i < 64; i++) { ip[i] = k[i] ^ 0x36; op[i] = k[i] ^ 0x5c; }
  sha_init(&s); sha_add(&s, ip, 64); sha_add(&s, msg, mlen); sha_end(&s, inner);
  sha_init(&s); sha_add(&s, op, 64); sha_add(&s, inner, 32); sha_end(&s, out);
}

/* ---- state ---- */
#define MAXCONN 64
#define MAXCMD 1024
#define MAXFRAME (16 << 20)
#define WINDOW (4 << 20)
#define HELLO "corral-agent-hello-1"
#define IDLE_MS (10 * 60 * 1000)

typedef struct { unsigned char *p; size_t len, cap; } buf_t;
typedef struct {
  int fd, wfd, authed;        /* wfd: where answers go (fd itself, but stdout in stdio mode) */
  unsigned char nonce[32];
  buf_t in, out;
} conn_t;
typedef struct {
  int used, conn;             /* conn index; -1 when its connection went away */
  uint32_t id;
  pid_t pid;
  int pidfd, report, in, out, err;
  buf_t stdin_q;              /* one chunk at a time: acked when written */
  int close_in;               /* close stdin once the queue is written */
  long unacked[2];
  int have_status, status;
  int ctl;                    /* docker mode: the control pipe to the command's init */
  int batch;                  /* an 'R' request: output held until the status (see emit) */
  buf_t held;
} cmd_t;

static conn_t conns[MAXCONN];
static cmd_t cmds[MAXCMD];
static int listen_fd = -1;
static unsigned char key[64];
static size_t key_len;
static unsigned char first[32]; /* a one-time token: the launching host's first connection */
static int first_valid;
/* Docker mode (corral.providers._docker_agent): the agent is the container's root, its one
   connection is its stdin/stdout (a docker exec stream), commands run as run_uid. */
static int stdio_mode;
static long run_uid = -1;

static void close_conn_fds(int c) {
  if (conns[c].wfd >= 0 && conns[c].wfd != conns[c].fd) close(conns[c].wfd);
  conns[c].wfd = -1;
  if (conns[c].fd >= 0) close(conns[c].fd);
  conns[c].fd = -1;
}

static int put(buf_t *b, const void *p, size_t n) {
  if (b->len + n > b->cap) {
    size_t c = b->cap ? b->cap : 4096;
    while (c < b->len + n) c *= 2;
    unsigned char *q = realloc(b->p, c);
    if (!q) return -1;
    b->p = q; b->cap = c;
  }
  memcpy(b->p + b->len, p, n);
  b->len += n;
  return 0;
}
static void drop(buf_t *b, size_t n) {
  memmove(b->p, b->p + n, b->len - n);
  b->len -= n;
}
static void bfree(buf_t *b) { free(b->p); b->p = NULL; b->len = b->cap = 0; }

static void send_frame(int c, uint32_t id, char type, const void *p, size_t n) {
  if (c < 0 || conns[c].fd < 0) return;
  unsigned char h[9];
  uint32_t len = (uint32_t)(n + 5);
  memcpy(h, &len, 4); memcpy(h + 4, &id, 4); h[8] = (unsigned char)type;
  if (put(&conns[c].out, h, 9) || put(&conns[c].out, p, n)) { conns[c].out.len = 0; close_conn_fds(c); }
}
static void send_text(int c, uint32_t id, char type, const char *msg) { send_frame(c, id, type, msg, strlen(msg)); }

/* A run to completion ('R': the host reads nothing before the end) gets its output in one
   write with its status: chunks and EOFs are held (up to HOLD bytes, well under the
   window) until the status is in, so a short command costs the host one wake-up. */
#define HOLD (64 << 10)
static void flush_held(cmd_t *k) {
  int c = k->conn;
  if (k->held.len && c >= 0 && conns[c].fd >= 0 && put(&conns[c].out, k->held.p, k->held.len)) {
    conns[c].out.len = 0; close_conn_fds(c);
  }
  k->held.len = 0;
}
static void emit(cmd_t *k, char type, const void *p, size_t n) {
  if (!k->batch || k->have_status || k->conn < 0) { send_frame(k->conn, k->id, type, p, n); return; }
  unsigned char h[9];
  uint32_t len = (uint32_t)(n + 5);
  memcpy(h, &len, 4); memcpy(h + 4, &k->id, 4); h[8] = (unsigned char)type;
  if (put(&k->held, h, 9) || put(&k->held, p, n)) { k->batch = 0; flush_held(k); send_frame(k->conn, k->id, type, p, n); return; }
  if (k->held.len >= HOLD) flush_held(k);
}

static void xclose(int *fd) { if (*fd >= 0) { close(*fd); *fd = -1; } }

static void drop_conn(int c) {
  close_conn_fds(c);
  bfree(&conns[c].in); bfree(&conns[c].out);
  explicit_bzero(conns[c].nonce, 32);
  conns[c].authed = 0;
  for (int i = 0; i < MAXCMD; i++)
    if (cmds[i].used && cmds[i].conn == c) {
      /* Nobody listens any more: the command keeps running, its output pipes are closed
         (it gets EPIPE, as when the host process that started it exits). */
      cmds[i].conn = -1;
      xclose(&cmds[i].in); xclose(&cmds[i].out); xclose(&cmds[i].err);
      bfree(&cmds[i].stdin_q); bfree(&cmds[i].held);
    }
}

static void free_cmd(cmd_t *k) {
  xclose(&k->pidfd); xclose(&k->report); xclose(&k->in); xclose(&k->out); xclose(&k->err);
  xclose(&k->ctl);
  bfree(&k->stdin_q); bfree(&k->held);
  memset(k, 0, sizeof *k);
  k->pidfd = k->report = k->in = k->out = k->err = k->ctl = -1;
}

/* ---- the per-command init: pid 1 of the command's own pid namespace ---- */
/* Only a signal from outside the command's namespace (the agent's: its sender has no pid
   here) is passed on to every process of the command; one sent from inside is dropped, as
   for an init without handlers. */
static void forward(int sig, siginfo_t *si, void *ctx) {
  (void)ctx;
  if (si->si_code == SI_USER && si->si_pid == 0) kill(-1, sig);
}

static int num(const char *s, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end) return -1;
  *out = v;
  return 0;
}

static void no_caps(void) {
  struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct d[2];
  memset(d, 0, sizeof d);
  prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
  if (syscall(SYS_capset, &h, d) != 0) _exit(125);
}

/* fds on entry (already moved): 3 stdin-r, 4 stdout-w, 5 stderr-w, 6 report-w. */
/* The command's own /proc (its pid namespace's), with the covers bwrap puts on a
   sandbox's /proc; then no capability at all. */
static void own_proc(void) {
  static const char *covers[] = {"/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus"};
  /* Slave, not private: nothing mounted here reaches the agent's namespace, and a mount
     that later reaches the agent's (a host mount under a bound directory) still reaches
     this one, as it would a namespace made at the request (a warm spare's is made ahead). */
  if (mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) != 0) _exit(125);
  if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0) _exit(125);
  for (size_t i = 0; i < sizeof covers / sizeof *covers; i++) {
    if (access(covers[i], F_OK) != 0) continue;
    if (mount(covers[i], covers[i], NULL, MS_BIND | MS_REC, NULL) != 0 ||
        mount(NULL, covers[i], NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0)
      _exit(125);
  }
}

/* Everything of the init that does not depend on the command: done at the request (a
   cold start) or ahead of it (the warm spare, below). */
static void init_prepare(void) {
  own_proc();
  no_caps();
  setsid();
  explicit_bzero(key, sizeof key);
  explicit_bzero(first, sizeof first);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = forward;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  for (int s = 1; s < 32; s++)
    if (s != SIGKILL && s != SIGSTOP && s != SIGCHLD) sigaction(s, &sa, NULL);
}

typedef struct { const char *cwd; char **args, **envp; } launch_t;

/* The launch fields (cwd, the number of variables, NAME=VALUE each, argv; NUL-terminated). */
static void parse_launch(char *blob, size_t len, launch_t *l) {
  size_t nf = 0;
  for (size_t i = 0; i < len; i++) nf += blob[i] == '\0';
  char **f = calloc(nf + 1, sizeof(char *));
  if (!f) _exit(125);
  for (size_t i = 0, k = 0; k < nf; k++) { f[k] = blob + i; i += strlen(blob + i) + 1; }
  long nenv;
  if (nf < 3 || num(f[1], &nenv) || nenv < 0 || (size_t)nenv > nf - 3) _exit(125);
  l->cwd = f[0];
  l->args = f + 2 + nenv;
  l->envp = calloc((size_t)nenv + 1, sizeof(char *));
  if (!l->envp) _exit(125);
  memcpy(l->envp, f + 2, (size_t)nenv * sizeof(char *));
}

/* In the command's process (a child of the init): default signals, the pipes at 0..2. */
static void child_fds(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = SIG_DFL;
  for (int s = 1; s < 32; s++)
    if (s != SIGKILL && s != SIGSTOP) sigaction(s, &sa, NULL);
  sigset_t none; sigemptyset(&none); sigprocmask(SIG_SETMASK, &none, NULL);
  if (dup2(3, 0) < 0 || dup2(4, 1) < 0 || dup2(5, 2) < 0) _exit(125);
  close(3); close(4); close(5); close(6);
}

static void child_exec(const launch_t *l) {
  if (chdir(l->cwd) != 0) { dprintf(2, "corral: cannot enter %s: %s\n", l->cwd, strerror(errno)); _exit(126); }
  environ = l->envp; /* execvp searches the command's own PATH */
  execvp(l->args[0], l->args);
  int e = errno;
  dprintf(2, "corral: %s: %s\n", l->args[0], strerror(e));
  _exit(e == ENOENT ? 127 : 126);
}

/* The init, once the command's process is started: reap everything until the command
   ends, report its raw status on fd 6 (which only the agent reads), and end (the kernel
   then kills whatever is left in the namespace). */
static void report_status(int s) {
  char line[16];
  int n = snprintf(line, sizeof line, "%d\n", s);
  ssize_t wr;
  do wr = write(6, line, (size_t)n); while (wr < 0 && errno == EINTR);
  _exit(0);
}

static void wait_report(pid_t pid) {
  close(3); close(4); close(5);
  int s = 255 << 8;
  for (;;) {
    int st;
    pid_t w = waitpid(-1, &st, 0);
    if (w < 0) { if (errno == EINTR) continue; break; }
    if (w == pid) { s = st; break; }
  }
  report_status(s);
}

/* A cold start: the command in a child of the init (the init stays the namespace's
   reaper, and it alone writes the report). */
static void mini_init(char *blob, size_t len) {
  init_prepare();
  launch_t l;
  parse_launch(blob, len, &l);
  pid_t pid = fork();
  if (pid < 0) { dprintf(5, "corral: cannot start %s: fork: %s\n", l.args[0], strerror(errno)); _exit(126); }
  if (pid == 0) { child_fds(); child_exec(&l); }
  wait_report(pid);
}

/* ---- the warm spare: the next command's init, made ahead (its pid and mount namespace,
   its /proc and covers, no capability), with the command's process already forked and
   waiting on a pipe only the agent holds for the launch fields (u32 length, then the
   blob). A request hands them over: the command is then one exec away, and its init is
   already waiting for it. Made again as soon as a status is sent. After a spare could not
   be made (the pids limit refused it) or died unused, the next one is only tried once
   nothing has run for a while (SPARE_RETRY_MS, doubling up to a minute while it keeps
   failing): a refused fork counts in the sandbox's pids events, which corral reads around
   each command, and a spare that cannot come up must not spin. The spare holds nothing of
   the agent's (its descriptors are closed, its copy of the key wiped), and once it has its
   command it is exactly a cold init and its command. ---- */
#define SPARE_MAX 60000   /* larger requests start cold (a pipe takes this much at once) */
static struct { pid_t pid; int pidfd, ctl, in, out, err, report; } spare = {0, -1, -1, -1, -1, -1, -1};
static int spare_off;      /* the last spare failed: retry when quiet, after spare_wait ms */
static int spare_wait;
static int served;         /* a first request came: spares from now on (a sandbox made and
                              destroyed unused pays for none) */
#define SPARE_RETRY_MS 1000

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int read_full(int fd, void *p, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, (char *)p + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    got += (size_t)r;
  }
  return 0;
}

/* fds on entry: 3..6 as for a cold init, 7 the control pipe's read end (close-on-exec). */
static void spare_main(void) {
  init_prepare();
  pid_t pid = fork();
  if (pid < 0) { /* as a cold init says it (if a request was handed over meanwhile) */
    dprintf(5, "corral: cannot start the command: fork: %s\n", strerror(errno));
    report_status(126 << 8);
  }
  if (pid == 0) {
    child_fds(); /* named corral-spare until its exec: an idle spare, by name */
    uint32_t len;
    if (read_full(7, &len, 4) || len == 0 || len > SPARE_MAX) _exit(0); /* dropped unused */
    char *blob = malloc(len);
    if (!blob || read_full(7, blob, len)) _exit(125);
    close(7);
    if (blob[len - 1] != '\0') _exit(125);
    launch_t l;
    parse_launch(blob, len, &l);
    child_exec(&l);
  }
  prctl(PR_SET_NAME, "corral-agent", 0, 0, 0);
  close(7);
  wait_report(pid);
}

static void spare_drop(void) {
  if (spare.pid <= 0) return;
  xclose(&spare.ctl);
  syscall(SYS_pidfd_send_signal, spare.pidfd, SIGKILL, NULL, 0);
  siginfo_t si;
  while (waitid(P_PIDFD, (id_t)spare.pidfd, &si, WEXITED) != 0 && errno == EINTR) {}
  xclose(&spare.pidfd); xclose(&spare.in); xclose(&spare.out); xclose(&spare.err); xclose(&spare.report);
  spare.pid = 0;
}

/* The spare failed (could not be made, or died unused): the next try waits (see above). */
static void spare_failed(void) {
  spare_wait = spare_off ? (spare_wait < 30000 ? 2 * spare_wait : 60000) : SPARE_RETRY_MS;
  spare_off = 1;
}

/* In a command's init (fds as in make_spare): its ends of the five pipes on 3..7, nothing
   else open; the report (6) and control (7) ends are not inherited by the command. */
static void init_fds(const int fds[10]) {
  int keep[5] = {fds[0], fds[3], fds[5], fds[7], fds[8]};
  for (int i = 0; i < 5; i++) { keep[i] = fcntl(keep[i], F_DUPFD, 100); if (keep[i] < 0) _exit(125); }
  for (int i = 0; i < 5; i++) if (dup2(keep[i], 3 + i) < 0) _exit(125);
  syscall(SYS_close_range, 8, ~0U, 0);
  fcntl(6, F_SETFD, FD_CLOEXEC);
  fcntl(7, F_SETFD, FD_CLOEXEC);
}

static void make_spare(void) {
  /* fds: 0/1 stdin (r, w), 2/3 stdout, 4/5 stderr, 6/7 report, 8/9 control */
  int fds[10] = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
  int pidfd = -1;
  long pid = -1;
  for (int i = 0; i < 5; i++)
    if (pipe2(fds + 2 * i, O_CLOEXEC)) goto fail;
  struct clone_args a;
  memset(&a, 0, sizeof a);
  a.flags = CLONE_NEWPID | CLONE_NEWNS | CLONE_PIDFD;
  a.pidfd = (uint64_t)(uintptr_t)&pidfd;
  a.exit_signal = SIGCHLD;
  pid = syscall(SYS_clone3, &a, sizeof a);
  if (pid == 0) {
    /* Named as a spare while it is one (its init takes the agent's name back once its
       process, below, is forked and named so: whoever counts processes can tell). */
    prctl(PR_SET_NAME, "corral-spare", 0, 0, 0);
    init_fds(fds);
    spare_main();
  }
  if (pid < 0) goto fail;
  close(fds[0]); close(fds[3]); close(fds[5]); close(fds[7]); close(fds[8]);
  spare.pid = (pid_t)pid; spare.pidfd = pidfd; spare.ctl = fds[9];
  spare.in = fds[1]; spare.out = fds[2]; spare.err = fds[4]; spare.report = fds[6];
  int nb[5] = {spare.in, spare.out, spare.err, spare.report, spare.ctl};
  for (int i = 0; i < 5; i++) fcntl(nb[i], F_SETFL, O_NONBLOCK);
  return;
fail:
  for (int j = 0; j < 10; j++) xclose(&fds[j]);
  spare_failed();
}


/* Hand the launch fields to the spare; 0 when it has them (its descriptors are then the
   command's, in k), -1 when this request must start cold (the spare is gone). */
static int spare_take(cmd_t *k, char *blob, size_t len) {
  if (spare.pid <= 0 || len > SPARE_MAX) return -1;
  uint32_t l32 = (uint32_t)len;
  struct iovec iv[2] = {{&l32, 4}, {blob, len}};
  ssize_t w;
  do w = writev(spare.ctl, iv, 2); while (w < 0 && errno == EINTR);
  if (w != (ssize_t)len + 4) { spare_drop(); return -1; } /* dead, or a short pipe: cold */
  xclose(&spare.ctl);
  k->pid = spare.pid; k->pidfd = spare.pidfd;
  k->in = spare.in; k->out = spare.out; k->err = spare.err; k->report = spare.report;
  spare.pid = 0;
  spare.pidfd = spare.in = spare.out = spare.err = spare.report = -1;
  return 0;
}

static void start_docker(int c, uint32_t id, char *blob, size_t len, int batch);
static void start(int c, uint32_t id, char *blob, size_t len, int batch) {
  if (run_uid >= 0) { start_docker(c, id, blob, len, batch); return; }
  served = 1;
  int slot = -1;
  for (int i = 0; i < MAXCMD; i++) {
    if (cmds[i].used && cmds[i].conn == c && cmds[i].id == id) { send_text(c, id, 'e', "request id in use"); return; }
    if (!cmds[i].used && slot < 0) slot = i;
  }
  if (slot < 0) { send_text(c, id, 'e', "too many commands at once in this sandbox"); return; }
  if (len < 1 || blob[len - 1] != '\0') { send_text(c, id, 'e', "malformed start request"); return; }
  cmd_t *k = &cmds[slot];
  if (spare_take(k, blob, len) == 0) {
    k->used = 1; k->conn = c; k->id = id;
    k->unacked[0] = k->unacked[1] = 0;
    k->have_status = 0; k->close_in = 0; k->batch = batch;
    uint32_t p32 = (uint32_t)k->pid;
    if (!batch) send_frame(c, id, 'p', &p32, 4);
    return;
  }
  int fds[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
  for (int i = 0; i < 4; i++)
    if (pipe2(fds + 2 * i, O_CLOEXEC)) {
      char msg[128];
      snprintf(msg, sizeof msg, "cannot start the command: pipe: %s", strerror(errno));
      send_text(c, id, 'e', msg);
      for (int j = 0; j < 8; j++) xclose(&fds[j]);
      return;
    }
  /* fds: 0/1 stdin (r, w), 2/3 stdout, 4/5 stderr, 6/7 report */
  int pidfd = -1;
  struct clone_args a;
  memset(&a, 0, sizeof a);
  a.flags = CLONE_NEWPID | CLONE_NEWNS | CLONE_PIDFD;
  a.pidfd = (uint64_t)(uintptr_t)&pidfd;
  a.exit_signal = SIGCHLD;
  long pid = syscall(SYS_clone3, &a, sizeof a);
  if (pid == 0) {
    /* Keep only the command's ends, at 3..6; close everything else of the agent's. */
    int keep[4] = {fds[0], fds[3], fds[5], fds[7]};
    for (int i = 0; i < 4; i++) { keep[i] = fcntl(keep[i], F_DUPFD, 100); if (keep[i] < 0) _exit(125); }
    for (int i = 0; i < 4; i++) if (dup2(keep[i], 3 + i) < 0) _exit(125);
    syscall(SYS_close_range, 7, ~0U, 0);
    fcntl(6, F_SETFD, FD_CLOEXEC);
    mini_init(blob, len);
  }
  if (pid < 0) {
    char msg[128];
    snprintf(msg, sizeof msg, "cannot start the command: clone: %s", strerror(errno));
    send_text(c, id, 'e', msg);
    for (int j = 0; j < 8; j++) xclose(&fds[j]);
    return;
  }
  close(fds[0]); close(fds[3]); close(fds[5]); close(fds[7]);
  k->used = 1; k->conn = c; k->id = id; k->pid = (pid_t)pid; k->pidfd = pidfd;
  k->in = fds[1]; k->out = fds[2]; k->err = fds[4]; k->report = fds[6];
  k->unacked[0] = k->unacked[1] = 0;
  k->have_status = 0; k->close_in = 0; k->batch = batch;
  int nb[4] = {k->in, k->out, k->err, k->report};
  for (int i = 0; i < 4; i++) fcntl(nb[i], F_SETFL, O_NONBLOCK);
  uint32_t p32 = (uint32_t)pid;
  if (!batch) send_frame(c, id, 'p', &p32, 4);
}

/* ---- docker mode: no pid namespace (the container grants no CAP_SYS_ADMIN); each
   command's init is a root child of the agent, a child subreaper: every process the
   command starts stays its descendant, whatever it does (setsid, double forks), so the init
   finds them all in /proc and kills them with the command (see _docker_agent). ---- */
static unsigned char *tree_mark;   /* a bitmap of pids: this init's descendants */
static size_t tree_bytes;

/* Signal every descendant of this process (pid ns of the container); how many. */
static int signal_tree(int sig) {
  DIR *d = opendir("/proc");
  if (!d) return 0;
  size_t cap = 256, np = 0;
  pid_t (*pp)[2] = malloc(cap * sizeof *pp);
  struct dirent *e;
  while (pp && (e = readdir(d))) {
    long pid;
    if (num(e->d_name, &pid) || pid <= 0) continue;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ssize_t r = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (r <= 0) continue;
    buf[r] = 0;
    char *rp = strrchr(buf, ')');
    long ppid;
    char state;
    if (!rp || sscanf(rp + 1, " %c %ld", &state, &ppid) != 2) continue;
    if (np == cap) { cap *= 2; pid_t (*q)[2] = realloc(pp, cap * sizeof *pp); if (!q) break; pp = q; }
    pp[np][0] = (pid_t)pid; pp[np][1] = (pid_t)ppid; np++;
  }
  closedir(d);
  if (!pp) return 0;
  pid_t me = getpid();
  size_t need = 0;
  for (size_t i = 0; i < np; i++) if ((size_t)pp[i][0] / 8 + 1 > need) need = (size_t)pp[i][0] / 8 + 1;
  if ((size_t)me / 8 + 1 > need) need = (size_t)me / 8 + 1;
  if (need > tree_bytes) { free(tree_mark); tree_mark = calloc(need, 1); tree_bytes = tree_mark ? need : 0; }
  if (!tree_mark) { free(pp); return 0; }
  memset(tree_mark, 0, tree_bytes);
  tree_mark[me / 8] |= (unsigned char)(1 << (me % 8));
  int hit = 0;
  for (int changed = 1; changed;) {
    changed = 0;
    for (size_t i = 0; i < np; i++) {
      pid_t p = pp[i][0], q = pp[i][1];
      if (q <= 0 || (tree_mark[p / 8] >> (p % 8)) & 1) continue;
      if ((tree_mark[q / 8] >> (q % 8)) & 1) { tree_mark[p / 8] |= (unsigned char)(1 << (p % 8)); changed = 1; }
    }
  }
  for (size_t i = 0; i < np; i++) {
    pid_t p = pp[i][0];
    if (p != me && (tree_mark[p / 8] >> (p % 8)) & 1) { kill(p, sig); hit++; }
  }
  free(pp);
  return hit;
}

/* Kill every descendant and reap them all; the command's own status into *st. */
static void kill_all(pid_t main_pid, int *st, int *done) {
  for (;;) {
    signal_tree(SIGKILL);
    int s;
    pid_t w = waitpid(-1, &s, 0);
    if (w < 0) { if (errno == EINTR) continue; return; } /* ECHILD: nothing is left */
    if (w == main_pid && !*done) { *st = s; *done = 1; }
    while ((w = waitpid(-1, &s, WNOHANG)) > 0)
      if (w == main_pid && !*done) { *st = s; *done = 1; }
    if (w < 0 && errno == ECHILD) return;
  }
}

/* Which limit counters of the container's cgroup moved: memory (oom kills), pids (forks
   refused); v2, then v1. */
static long counter(const char *path, const char *name) {
  FILE *f = fopen(path, "re");
  if (!f) return -1;
  char k[64];
  long v, out = -1;
  while (fscanf(f, "%63s %ld", k, &v) == 2) if (!strcmp(k, name)) { out = v; break; }
  fclose(f);
  return out;
}
static void limit_counters(long out[2]) {
  out[0] = counter("/sys/fs/cgroup/memory.events", "oom_kill");
  if (out[0] < 0) out[0] = counter("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill");
  out[1] = counter("/sys/fs/cgroup/pids.events", "max");
  if (out[1] < 0) out[1] = counter("/sys/fs/cgroup/pids/pids.events", "max");
}

/* fds on entry: 3 stdin-r, 4 stdout-w, 5 stderr-w, 6 report-w, 7 control-r. The report is
   the raw wait status, plus 1<<16 when the memory limit was hit meanwhile, 1<<17 the pids
   limit, and 1<<18 (alone) when the working directory does not exist. */
static void mini_init_docker(char *blob, size_t len) {
  if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) _exit(125);
  launch_t l;
  parse_launch(blob, len, &l);
  const char *cwd = l.cwd;
  char **args = l.args, **envp = l.envp;
  char line[32];
  struct stat sb;
  if (stat(cwd, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
    int n = snprintf(line, sizeof line, "%d\n", 1 << 18);
    ssize_t wr;
    do wr = write(6, line, (size_t)n); while (wr < 0 && errno == EINTR);
    _exit(0);
  }
  sigset_t chld, none;
  sigemptyset(&chld); sigaddset(&chld, SIGCHLD); sigemptyset(&none);
  sigprocmask(SIG_BLOCK, &chld, NULL);
  int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) _exit(125);
  long before[2], after[2];
  limit_counters(before);
  pid_t pid = fork();
  if (pid < 0) { dprintf(5, "corral: cannot start %s: fork: %s\n", args[0], strerror(errno)); _exit(126); }
  if (pid == 0) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    for (int s = 1; s < 32; s++)
      if (s != SIGKILL && s != SIGSTOP) sigaction(s, &sa, NULL);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (dup2(3, 0) < 0 || dup2(4, 1) < 0 || dup2(5, 2) < 0) _exit(125);
    syscall(SYS_close_range, 3, ~0U, 0);
    setsid();
    int oom = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (oom >= 0) { ssize_t wr = write(oom, "1000", 4); (void)wr; close(oom); }
    /* The agent's uid: no groups; leaving uid 0 drops every capability. */
    if (setgroups(0, NULL) != 0 || setgid((gid_t)run_uid) != 0 || setuid((uid_t)run_uid) != 0) {
      dprintf(2, "corral: cannot become uid %ld: %s\n", run_uid, strerror(errno));
      _exit(125);
    }
    explicit_bzero(key, sizeof key);
    if (chdir(cwd) != 0) { dprintf(2, "corral: cannot enter %s: %s\n", cwd, strerror(errno)); _exit(126); }
    environ = envp;
    execvp(args[0], args);
    int e = errno;
    dprintf(2, "corral: %s: %s\n", args[0], strerror(e));
    _exit(e == ENOENT ? 127 : 126);
  }
  close(3); close(4); close(5);
  int st = 255 << 8, done = 0;
  while (!done) {
    struct pollfd p[2] = {{sfd, POLLIN, 0}, {7, POLLIN, 0}};
    if (poll(p, 2, -1) < 0) { if (errno == EINTR) continue; break; }
    if (p[1].revents) {
      unsigned char s;
      ssize_t r = read(7, &s, 1);
      if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) {
        /* The agent is gone: nobody can wait for the command any more; end it. */
        kill_all(pid, &st, &done);
        _exit(0);
      }
      if (r == 1 && s == SIGKILL) kill_all(pid, &st, &done);
      else if (r == 1 && s > 0 && s < 65) signal_tree(s);
    }
    if (p[0].revents) {
      struct signalfd_siginfo si;
      while (read(sfd, &si, sizeof si) > 0) {}
      int s;
      pid_t w;
      while ((w = waitpid(-1, &s, WNOHANG)) > 0)
        if (w == pid && !done) { st = s; done = 1; }
    }
  }
  kill_all(pid, &st, &done); /* what the command left running ends with it */
  limit_counters(after);
  int rep = st & 0xffff;
  if (after[0] > before[0]) rep |= 1 << 16;
  else if (after[1] > before[1]) rep |= 1 << 17;
  int n = snprintf(line, sizeof line, "%d\n", rep);
  ssize_t wr;
  do wr = write(6, line, (size_t)n); while (wr < 0 && errno == EINTR);
  _exit(0);
}

static void start_docker(int c, uint32_t id, char *blob, size_t len, int batch) {
  int slot = -1;
  for (int i = 0; i < MAXCMD; i++) {
    if (cmds[i].used && cmds[i].conn == c && cmds[i].id == id) { send_text(c, id, 'e', "request id in use"); return; }
    if (!cmds[i].used && slot < 0) slot = i;
  }
  if (slot < 0) { send_text(c, id, 'e', "too many commands at once in this sandbox"); return; }
  if (len < 1 || blob[len - 1] != '\0') { send_text(c, id, 'e', "malformed start request"); return; }
  /* fds: 0/1 stdin (r, w), 2/3 stdout, 4/5 stderr, 6/7 report, 8/9 control */
  int fds[10] = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
  for (int i = 0; i < 5; i++)
    if (pipe2(fds + 2 * i, O_CLOEXEC)) {
      char msg[128];
      snprintf(msg, sizeof msg, "cannot start the command: pipe: %s", strerror(errno));
      send_text(c, id, 'e', msg);
      for (int j = 0; j < 10; j++) xclose(&fds[j]);
      return;
    }
  pid_t pid = fork();
  if (pid == 0) {
    init_fds(fds);
    mini_init_docker(blob, len);
  }
  int pidfd = pid > 0 ? (int)syscall(SYS_pidfd_open, pid, 0) : -1;
  if (pid < 0 || pidfd < 0) {
    char msg[128];
    snprintf(msg, sizeof msg, "cannot start the command: %s: %s", pid < 0 ? "fork" : "pidfd_open", strerror(errno));
    if (pid > 0) { kill(pid, SIGKILL); waitpid(pid, NULL, 0); }
    send_text(c, id, 'e', msg);
    for (int j = 0; j < 10; j++) xclose(&fds[j]);
    return;
  }
  close(fds[0]); close(fds[3]); close(fds[5]); close(fds[7]); close(fds[8]);
  cmd_t *k = &cmds[slot];
  k->used = 1; k->conn = c; k->id = id; k->pid = pid; k->pidfd = pidfd;
  k->in = fds[1]; k->out = fds[2]; k->err = fds[4]; k->report = fds[6]; k->ctl = fds[9];
  k->unacked[0] = k->unacked[1] = 0;
  k->have_status = 0; k->close_in = 0; k->batch = batch;
  int nb[5] = {k->in, k->out, k->err, k->report, k->ctl};
  for (int i = 0; i < 5; i++) fcntl(nb[i], F_SETFL, O_NONBLOCK);
  uint32_t p32 = (uint32_t)pid;
  if (!batch) send_frame(c, id, 'p', &p32, 4);
}

static cmd_t *find(int c, uint32_t id) {
  for (int i = 0; i < MAXCMD; i++)
    if (cmds[i].used && cmds[i].conn == c && cmds[i].id == id) return &cmds[i];
  return NULL;
}

static void flush_stdin(cmd_t *k) {
  while (k->in >= 0 && k->stdin_q.len) {
    ssize_t w = write(k->in, k->stdin_q.p, k->stdin_q.len);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) return;
    if (w <= 0) { /* the command closed its stdin */
      xclose(&k->in);
      k->stdin_q.len = 0;
      unsigned char st = 1;
      emit(k, 'i', &st, 1);
      return;
    }
    drop(&k->stdin_q, (size_t)w);
    if (!k->stdin_q.len) { unsigned char st = 0; emit(k, 'i', &st, 1); }
  }
  if (k->close_in && !k->stdin_q.len) xclose(&k->in);
}

/* One frame from connection c; returns -1 to drop the connection. */
static int frame(int c, uint32_t id, char type, unsigned char *p, size_t n) {
  conn_t *cn = &conns[c];
  if (!cn->authed) {
    unsigned char msg[32 + sizeof HELLO], want[32];
    if (type == 'T' && n == 32 && first_valid) {
      /* The one-time token given with the key: good for one connection, then gone. */
      unsigned char d = 0;
      for (int i = 0; i < 32; i++) d |= first[i] ^ p[i];
      first_valid = 0;
      explicit_bzero(first, sizeof first);
      if (d) return -1;
      cn->authed = 1;
      send_text(c, 0, 'h', "corral-agent 1");
      return 0;
    }
    if (type != 'H' || n != 32) return -1;
    memcpy(msg, cn->nonce, 32); memcpy(msg + 32, HELLO, sizeof HELLO - 1);
    hmac(key, key_len, msg, 32 + sizeof HELLO - 1, want);
    unsigned char diff = 0;
    for (int i = 0; i < 32; i++) diff |= want[i] ^ p[i];
    if (diff) return -1;
    cn->authed = 1;
    send_text(c, 0, 'h', "corral-agent 1");
    return 0;
  }
  cmd_t *k;
  switch (type) {
  case 'S': start(c, id, (char *)p, n, 0); return 0;
  case 'R': start(c, id, (char *)p, n, 1); return 0;
  case 'I':
    if (!(k = find(c, id))) return 0;
    if (k->in < 0) { unsigned char st = 1; send_frame(c, id, 'i', &st, 1); return 0; }
    if (put(&k->stdin_q, p, n)) return -1;
    flush_stdin(k);
    return 0;
  case 'C':
    if ((k = find(c, id))) { k->close_in = 1; flush_stdin(k); }
    return 0;
  case 'K':
    if (n != 1) return -1;
    if ((k = find(c, id)) && k->ctl >= 0 && !k->have_status) {
      ssize_t wr; /* docker mode: the command's init signals its tree (SIGKILL: kills it all) */
      do wr = write(k->ctl, p, 1); while (wr < 0 && errno == EINTR);
    } else if (k && k->pidfd >= 0 && !k->have_status)
      syscall(SYS_pidfd_send_signal, k->pidfd, (int)p[0], NULL, 0);
    return 0;
  case 'A': {
    uint32_t m;
    if (n != 5 || p[0] > 1) return -1;
    memcpy(&m, p + 1, 4);
    if ((k = find(c, id))) { k->unacked[p[0]] -= m; if (k->unacked[p[0]] < 0) k->unacked[p[0]] = 0; }
    return 0;
  }
  case 'D':
    if ((k = find(c, id))) {
      k->conn = -1;
      xclose(&k->in); xclose(&k->out); xclose(&k->err); bfree(&k->stdin_q); bfree(&k->held);
      if (k->have_status && k->pidfd < 0) free_cmd(k);
    }
    return 0;
  default: return -1;
  }
}

static void read_conn(int c) {
  conn_t *cn = &conns[c];
  unsigned char tmp[65536];
  ssize_t r = read(cn->fd, tmp, sizeof tmp);
  if (r < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (r <= 0 || put(&cn->in, tmp, (size_t)r)) { drop_conn(c); return; }
  size_t off = 0;
  while (cn->fd >= 0 && cn->in.len - off >= 9) {
    uint32_t len, id;
    memcpy(&len, cn->in.p + off, 4);
    if (len < 5 || len > MAXFRAME || (!cn->authed && len > 64)) { drop_conn(c); return; }
    if (cn->in.len - off < 4 + (size_t)len) break;
    memcpy(&id, cn->in.p + off + 4, 4);
    char type = (char)cn->in.p[off + 8];
    if (frame(c, id, type, cn->in.p + off + 9, len - 5)) { drop_conn(c); return; }
    off += 4 + len;
  }
  if (cn->fd >= 0) drop(&cn->in, off);
}

static void pump(cmd_t *k, int which) {
  int *fd = which ? &k->err : &k->out;
  unsigned char tmp[65536];
  ssize_t r = read(*fd, tmp, sizeof tmp);
  if (r < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (r <= 0) { xclose(fd); emit(k, which ? '2' : '1', "", 0); return; }
  k->unacked[which] += r;
  emit(k, which ? '2' : '1', tmp, (size_t)r);
}

/* The command's status: from its init's report (as soon as it is written: the init's own
   exit, which tears down its namespaces, is not waited for), or, when the init died
   without one, SIGKILL's. */
static void report(cmd_t *k, int dead) {
  char line[32] = {0};
  ssize_t r = k->report >= 0 ? read(k->report, line, sizeof line - 1) : -1;
  if (r < 0 && errno == EAGAIN && !dead) return;
  xclose(&k->report);
  long st;
  unsigned char rep = 1;
  char *nl = r > 0 ? strchr(line, '\n') : NULL;
  if (nl) *nl = 0;
  if (!nl || num(line, &st)) { st = SIGKILL; rep = 0; } /* killed before it could report */
  flush_held(k);
  k->have_status = 1;
  k->status = (int)st;
  xclose(&k->in);
  unsigned char x[5];
  int32_t s32 = (int32_t)st;
  memcpy(x, &s32, 4); x[4] = rep;
  send_frame(k->conn, k->id, 'x', x, 5);
}

static void reap(cmd_t *k) {
  siginfo_t si;
  memset(&si, 0, sizeof si);
  if (waitid(P_PIDFD, (id_t)k->pidfd, &si, WEXITED | WNOHANG) != 0 || si.si_pid == 0) return;
  xclose(&k->pidfd);
  if (!k->have_status) report(k, 1);
}

static void accept_conn(void) {
  int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) return;
  int c = -1;
  for (int i = 0; i < MAXCONN; i++) if (conns[i].fd < 0) { c = i; break; }
  if (c < 0) { close(fd); return; } /* full: refuse, keep serving the others */
  conns[c].fd = conns[c].wfd = fd;
  conns[c].authed = 0;
  if (getrandom(conns[c].nonce, 32, 0) != 32) { drop_conn(c); return; }
  send_frame(c, 0, 'n', conns[c].nonce, 32);
}

static int hexval(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  return -1;
}

int main(int argc, char **argv) {
  long lfd;
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) return 125;
  const char *filter;
  if (argc == 3 && !strcmp(argv[1], "stdio")) {
    /* Docker mode: `agent stdio <uid>` (see the docker-mode notes above). */
    if (num(argv[2], &run_uid) || run_uid <= 0) return 125;
    stdio_mode = 1;
    filter = "-";
  } else {
    if (argc != 3 || num(argv[1], &lfd) || lfd < 3) return 125;
    listen_fd = (int)lfd;
    filter = argv[2];
  }
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
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fprog, 0, 0) != 0) return 125;
    free(prog);
  }
  /* The key (128 hex digits) and the one-time token (64), each with a newline, on
     stdin; then stdin is /dev/null. Docker mode gets the key alone: its stream is its one
     connection, which always answers the nonce (no token, so no 'T' is ever accepted). */
  char hex[129 + 65];
  size_t got = 0, want = stdio_mode ? 129 : sizeof hex;
  while (got < want) {
    ssize_t r = read(0, hex + got, want - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return 125;
    got += (size_t)r;
  }
  if (hex[128] != '\n' || (!stdio_mode && hex[193] != '\n')) return 125;
  for (int i = 0; i < (stdio_mode ? 64 : 96); i++) {
    int hi = hexval(hex[2 * i + (i >= 64)]), lo = hexval(hex[2 * i + 1 + (i >= 64)]);
    if (hi < 0 || lo < 0) return 125;
    if (i < 64) key[i] = (unsigned char)(hi << 4 | lo);
    else first[i - 64] = (unsigned char)(hi << 4 | lo);
  }
  key_len = 64;
  first_valid = !stdio_mode;
  explicit_bzero(hex, sizeof hex);
  if (!stdio_mode) {
    int nul = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (nul < 0 || dup2(nul, 0) < 0 || dup2(nul, 1) < 0) return 125;
    close(nul);
    if (fcntl(listen_fd, F_SETFD, FD_CLOEXEC) || fcntl(listen_fd, F_SETFL, O_NONBLOCK)) return 125;
  }
  syscall(SYS_close_range, 3, ~0U, CLOSE_RANGE_CLOEXEC);
  signal(SIGPIPE, SIG_IGN);
  for (int i = 0; i < MAXCONN; i++) conns[i].fd = conns[i].wfd = -1;
  for (int i = 0; i < MAXCMD; i++) { cmds[i].pidfd = cmds[i].report = cmds[i].in = cmds[i].out = cmds[i].err = cmds[i].ctl = -1; }
  if (stdio_mode) {
    /* The one connection: stdin in, stdout out (stderr: the agent's log). */
    if (fcntl(0, F_SETFL, O_NONBLOCK) || fcntl(1, F_SETFL, O_NONBLOCK)) return 125;
    conns[0].fd = 0; conns[0].wfd = 1; conns[0].authed = 0;
    if (getrandom(conns[0].nonce, 32, 0) != 32) return 125;
    send_frame(0, 0, 'n', conns[0].nonce, 32);
    /* Out before anything is read (as after an accept): a pipe takes 41 bytes at once. */
    ssize_t r = write(1, conns[0].out.p, conns[0].out.len);
    if (r > 0) drop(&conns[0].out, (size_t)r);
  }

  static struct pollfd pf[2 + 2 * MAXCONN + 5 * MAXCMD];
  long long idle_since = 0;
  static int who[2 + 2 * MAXCONN + 5 * MAXCMD];
  for (;;) {
    /* Between requests (the answers are sent by now): the next command's init. */
    if (run_uid < 0 && spare.pid <= 0 && !spare_off && served) make_spare();
    /* After a failed spare: another try once nothing has run for spare_wait ms. */
    int running = 0;
    for (int i = 0; i < MAXCMD && !running; i++) running = cmds[i].used && !cmds[i].have_status;
    int retry = run_uid < 0 && spare.pid <= 0 && spare_off && !running && served;
    int n = 0;
    pf[n] = (struct pollfd){listen_fd, POLLIN, 0}; who[n++] = -1;
    if (spare.pid > 0) { pf[n] = (struct pollfd){spare.pidfd, POLLIN, 0}; who[n++] = -2; }
    for (int i = 0; i < MAXCONN; i++)
      if (conns[i].fd >= 0) {
        /* A host that does not read its answers is not read from either (bounded). */
        short ev = conns[i].out.len < (64u << 20) ? POLLIN : 0;
        if (conns[i].out.len && conns[i].wfd == conns[i].fd) ev |= POLLOUT;
        pf[n] = (struct pollfd){conns[i].fd, ev, 0}; who[n++] = i;
        if (conns[i].out.len && conns[i].wfd != conns[i].fd) { pf[n] = (struct pollfd){conns[i].wfd, POLLOUT, 0}; who[n++] = i; }
      }
    for (int i = 0; i < MAXCMD; i++) {
      cmd_t *k = &cmds[i];
      if (!k->used) continue;
      if (k->pidfd >= 0) { pf[n] = (struct pollfd){k->pidfd, POLLIN, 0}; who[n++] = 1000000 + 5 * i; }
      if (k->report >= 0) { pf[n] = (struct pollfd){k->report, POLLIN, 0}; who[n++] = 1000000 + 5 * i + 3; }
      if (k->out >= 0 && k->unacked[0] < WINDOW) { pf[n] = (struct pollfd){k->out, POLLIN, 0}; who[n++] = 1000000 + 5 * i + 1; }
      if (k->err >= 0 && k->unacked[1] < WINDOW) { pf[n] = (struct pollfd){k->err, POLLIN, 0}; who[n++] = 1000000 + 5 * i + 2; }
      if (k->in >= 0 && k->stdin_q.len) { pf[n] = (struct pollfd){k->in, POLLOUT, 0}; who[n++] = 1000000 + 5 * i + 4; }
    }
    /* Idle (no connection, no command) for IDLE_MS: exit; the next command starts a new
       agent. A sandbox nobody uses keeps no process. */
    int idle = 1;
    for (int i = 0; i < MAXCONN && idle; i++) idle = conns[i].fd < 0;
    for (int i = 0; i < MAXCMD && idle; i++) idle = !cmds[i].used;
    long long t0 = now_ms();
    if (!idle) idle_since = 0;
    else if (!idle_since) idle_since = t0;
    long long left = idle ? idle_since + IDLE_MS - t0 : -1;
    int wait = left < 0 && idle ? 0 : (int)left;
    if (retry && (wait < 0 || wait > spare_wait)) wait = spare_wait;
    int got = poll(pf, (nfds_t)n, wait);
    if (got < 0) { if (errno == EINTR) continue; return 125; }
    if (got == 0 && idle && now_ms() - idle_since >= IDLE_MS) { spare_drop(); return 0; }
    if (got == 0 && retry) {
      make_spare();
      if (spare.pid > 0) spare_off = 0;
      continue;
    }
    for (int j = 0; j < n; j++) {
      if (!pf[j].revents) continue;
      int w = who[j];
      if (w == -1) { accept_conn(); continue; }
      if (w == -2) { /* the spare died unused (killed, out of memory): replaced later */
        if (spare.pid > 0 && spare.pidfd == pf[j].fd) { spare_drop(); spare_failed(); }
        continue;
      }
      if (w < 1000000) {
        conn_t *cn = &conns[w];
        if (cn->fd != pf[j].fd && cn->wfd != pf[j].fd) continue; /* dropped meanwhile */
        int wr_side = cn->wfd == pf[j].fd, rd_side = cn->fd == pf[j].fd;
        if (wr_side && cn->out.len && (pf[j].revents & POLLOUT || (!rd_side && pf[j].revents & (POLLHUP | POLLERR)))) {
          ssize_t r = write(cn->wfd, cn->out.p, cn->out.len);
          if (r > 0) drop(&cn->out, (size_t)r);
          else if (r < 0 && errno != EAGAIN && errno != EINTR) { drop_conn(w); continue; }
        }
        if (rd_side && pf[j].revents & (POLLIN | POLLHUP | POLLERR)) read_conn(w);
        continue;
      }
      cmd_t *k = &cmds[(w - 1000000) / 5];
      int what = (w - 1000000) % 5;
      if (!k->used) continue;
      if (what == 0 && k->pidfd == pf[j].fd) reap(k);
      else if (what == 1 && k->out == pf[j].fd) pump(k, 0);
      else if (what == 2 && k->err == pf[j].fd) pump(k, 1);
      else if (what == 3 && k->report == pf[j].fd) report(k, 0);
      else if (what == 4 && k->in == pf[j].fd) flush_stdin(k);
      /* Forgotten once reaped and (or nobody listens) its output is all sent. */
      if (k->used && k->have_status && k->pidfd < 0 && (k->conn < 0 || (k->out < 0 && k->err < 0)))
        free_cmd(k);
    }
    /* Whatever a reply queued: try to send it at once (saves a poll round). */
    for (int i = 0; i < MAXCONN; i++)
      if (conns[i].fd >= 0 && conns[i].out.len) {
        ssize_t r = write(conns[i].wfd, conns[i].out.p, conns[i].out.len);
        if (r > 0) drop(&conns[i].out, (size_t)r);
        else if (r < 0 && errno != EAGAIN && errno != EINTR) drop_conn(i);
      }
    if (stdio_mode && conns[0].fd < 0) {
      /* Docker mode: nobody can reach this agent any more; it stays while its (detached)
         commands run, as their inits end them when it goes. */
      int busy = 0;
      for (int i = 0; i < MAXCMD && !busy; i++) busy = cmds[i].used;
      if (!busy) return 0;
    }
  }
}
"""
