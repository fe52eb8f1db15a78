"""Run a setup plan in a sandbox: serial steps share ``cd``/``export``; groups run at once.

Works over plain ``spawn`` on every provider. The serial steps of a plan run in **one**
shell (``bash``, or ``/bin/sh`` when the sandbox has none), each ``eval``ed in that shell
so ``cd`` and ``export`` stick; no helper program is started per step. Between steps the
shell resets what a fresh shell would not have inherited from the step before: ``set``
options, ``IFS``, the glob ``shopt``s, stdin (``/dev/null``) and stdout/stderr.

Step boundaries and exit codes travel on the shell's stdout, which no step writes to (a
step's stdout and stderr both go to the exec's stderr), each record prefixed with a
random nonce the shell reads from stdin: a program's output cannot forge another step's
exit code, and even a process that writes to the channel on purpose cannot guess the
nonce. The step's own output is cut into steps by nonce'd start markers on stderr, so a
failing step's tail is its own output only.

A step that calls ``exit 0`` ends the shell; its EXIT trap ``exec``s a fresh shell (cwd
and exports inherited, as between steps) that resumes at the next step. A parallel group
needs the state of the serial shell in several processes at once: the serial shell
reports ``pwd`` and ``env -0`` at the group (one ``env`` per group, not per step), and
each parallel step runs in its own shell that recreates that state from stdin. The state
is handed over on pipes only: never a file, never argv, so secret values in the
environment stay off the disk.

What a fresh shell per step used to drop and one shell keeps: unexported variables,
functions, aliases, ``umask`` and ``ulimit`` set by a step (as in the reference's one
``sh``). A step's EXIT trap runs only if that step calls ``exit``. Steps see the records'
fds (8, 9): writing there without the nonce does nothing.
"""

from __future__ import annotations

import math
import re
import secrets
import shlex
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import anyio

from corral._errors import CorralError
from corral.sandbox._contracts import ExecResult, Handle, Process
from corral.sandbox._redact import Redactor, live_redactor
from corral.sandbox._workspace import Parallel, SetupItem, Step
from corral.sandbox._traced import exec_span

__all__ = ["SetupError", "ShellState", "run_setup"]

TAIL_CHARS = 2000
# Bytes of a step's output kept for its tail: far more than TAIL_CHARS, so a secret that
# straddles the cut is still whole (and redacted) in what the tail shows.
_KEEP_BYTES = 1 << 16
# After the shell ends, how long its output may still be drained (a daemon started by a
# step can hold the pipes open forever; what the shell wrote is already in them).
_DRAIN_AFTER_EXIT = 2.0

# Variables the shell manages itself; carrying them over would be wrong or fail.
_SHELL_OWNED = frozenset(
    {
        "PWD", "OLDPWD", "SHLVL", "_", "SHELLOPTS", "BASHOPTS", "BASH_VERSINFO", "EUID",
        "UID", "PPID", "BASHPID", "GROUPS", "BASH_ARGV", "BASH_ARGC", "BASH_LINENO",
        "BASH_SOURCE", "FUNCNAME", "BASH_EXECUTION_STRING", "BASH_COMMAND", "BASH",
        "BASH_VERSION", "BASH_SUBSHELL", "RANDOM", "LINENO", "SECONDS",
    }
)  # fmt: skip

_NO_BASH = 127  # what every provider reports when the program is not found


class SetupError(CorralError):
    """A setup step failed. The message names the step, how it ended and its output's
    tail (secrets redacted)."""

    def __init__(self, step: str, how: str, tail: str) -> None:
        self.step = step
        self.how = how
        self.tail = tail
        super().__init__(f"setup step `{step}` failed ({how}); last output:\n{tail}")


@dataclass
class ShellState:
    """The serial shell's state, handed to the shells of a parallel group."""

    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    baseline: dict[str, str] = field(default_factory=dict)

    def prelude(self) -> bytes:
        """Shell text that recreates this state (sent on stdin)."""
        lines = []
        for name in sorted(set(self.baseline) - set(self.env)):
            if _portable(name):
                lines.append(f"unset {name}")
        for name, value in sorted(self.env.items()):
            if self.baseline.get(name) != value and _portable(name):
                lines.append(f"export {name}={shlex.quote(value)}")
        if self.cwd:
            lines.append(f"cd {shlex.quote(self.cwd)} || exit 97")
        return ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape")


def _portable(name: str) -> bool:
    return name not in _SHELL_OWNED and name.replace("_", "a").isalnum() and not name[0].isdigit()


def _parse_report(stdout: bytes) -> tuple[str, dict[str, str]] | None:
    cwd, sep, rest = stdout.partition(b"\0")
    if not sep:
        return None
    env: dict[str, str] = {}
    for entry in rest.split(b"\0"):
        if not entry:
            continue
        name, eq, value = entry.partition(b"=")
        if eq:
            env[name.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
    return cwd.decode("utf-8", "surrogateescape").rstrip("\n"), env


# ------------------------------------------------------------------------ the script
#
# fd 8 is the exec's stderr (every step's output), fd 9 its stdout (the records). Both
# are re-pointed before each step, so a step that closes or redirects its stdout/stderr
# (``exec 2>/dev/null``) does not silence the next one. Records start with a newline so
# a partial line written to the channel cannot swallow them.
_HEAD = r"""
IFS= read -r __corral_n || exit 96
__corral_from=$1
__corral_m() { printf '\n%s:%s\n' "$__corral_n" "$1" >&9; }
__corral_end() {
  __corral_rc=$1
  set +aCefuvx __RESET__
  unset IFS
  exec </dev/null 1>&8 2>&8
  __corral_m "E:$__corral_i:$__corral_rc"
  if [ "$__corral_rc" != 0 ]; then trap - EXIT; exit "$__corral_rc"; fi
}
__corral_exit() {
  __corral_rc=$?
  trap - EXIT
  exec </dev/null 1>&8 2>&8
  __corral_m "E:$__corral_i:$__corral_rc"
  [ "$__corral_rc" = 0 ] || exit "$__corral_rc"
  exec __SHELL__ -c '__corral_script=$1; shift; eval "$__corral_script"' corral-setup \
    "$__corral_script" "$((__corral_i + 1))" 1>&9 2>&8 <<__CORRAL_EOF
$__corral_n
__CORRAL_EOF
}
exec 8>&2 9>&1
"""

_PRELUDE = {
    True: 'if [ "$2" = prelude ]; then IFS= read -r -d "" __corral_st; eval "$__corral_st" || exit 96; fi\n',
    False: 'if [ "$2" = prelude ]; then __corral_st=$(cat) || exit 96; eval "$__corral_st" || exit 96; fi\n',
}
_RESET = {True: "+o pipefail; shopt -u nullglob failglob dotglob nocaseglob globstar extglob", False: ""}

_STEP = """if [ "$__corral_from" -le {i} ]; then
__corral_i={i}; trap __corral_exit EXIT; exec </dev/null 1>&8 2>&8
printf '\\n%s:S:{i}\\n' "$__corral_n" >&8; __corral_m S:{i}
eval {run}
__corral_end $?
fi
"""

_TAIL = """trap - EXIT
{report}__corral_m D
exit 0
"""
_REPORT = "__corral_m V; { pwd; printf '\\0'; env -0; } >&9; __corral_m W\n"


def _script(steps: Sequence[Step], *, shell: str, bash: bool, report: bool) -> str:
    body = _HEAD.replace("__RESET__", _RESET[bash]).replace("__SHELL__", shlex.quote(shell))
    body += _PRELUDE[bash] + "exec </dev/null\n"
    for i, step in enumerate(steps, 1):
        body += _STEP.format(i=i, run=shlex.quote(step.run))
    body += _TAIL.format(report=_REPORT if report else "")
    # The body keeps itself in a variable: the EXIT trap re-runs it from the next step.
    return f"__corral_script={shlex.quote(body)}\neval \"$__corral_script\"\n"


# ------------------------------------------------------------------------ parsing


class _Records:
    """The records on the shell's stdout; anything without the nonce is ignored."""

    def __init__(self, nonce: bytes) -> None:
        self._mark = b"\n" + nonce + b":"
        self._buf = bytearray()
        self.started = 0
        self.ended: dict[int, int] = {}
        self.done = False
        self.state: bytes | None = None

    def feed(self, chunk: bytes) -> list[tuple[str, int]]:
        """Add bytes; return the (kind, step) records completed by them."""
        self._buf += chunk
        out: list[tuple[str, int]] = []
        while True:
            at = self._buf.find(self._mark)
            if at < 0:
                # keep a possible partial mark, drop the rest (it is not ours)
                del self._buf[: max(0, len(self._buf) - len(self._mark))]
                return out
            del self._buf[:at]
            head = len(self._mark)
            nl = self._buf.find(b"\n", head)
            if nl < 0:
                return out
            rec = bytes(self._buf[head:nl])
            if rec == b"V":  # the state, up to the W record
                end = self._buf.find(self._mark + b"W\n", nl + 1)
                if end < 0:
                    return out
                self.state = bytes(self._buf[nl + 1 : end])
                del self._buf[: end + len(self._mark) + 2]
                continue
            del self._buf[:nl]  # keep the newline: it may start the next record
            m = re.fullmatch(rb"([SED])(?::(\d+))?(?::(\d+))?", rec)
            if m is None:
                continue
            kind, i, rc = m.group(1).decode(), int(m.group(2) or 0), m.group(3)
            if kind == "S" and i:
                self.started = i
            elif kind == "E" and i and rc is not None:
                self.ended[i] = int(rc)
            elif kind == "D":
                self.done = True
            out.append((kind, i))


_HEX = re.compile(rb"[0-9a-f]+")
_HEX_MARK = re.compile(rb"\n([0-9a-f]+):S:(\d+)\n")


class _Output:
    """The output of the step that runs now, cut at the nonce'd start markers on stderr."""

    def __init__(self, nonce: bytes) -> None:
        self._nonce = nonce
        # One pattern for every hex nonce, compiled once (a pattern per plan was a compile
        # per plan): its leftmost match whose hex run is the nonce is the leftmost marker.
        self._mark = _HEX_MARK if _HEX.fullmatch(nonce) else re.compile(
            rb"\n(" + re.escape(nonce) + rb"):S:(\d+)\n")
        self._keep = len(nonce) + 16
        self._buf = bytearray()
        self.step = 0

    def feed(self, chunk: bytes) -> None:
        self._buf += chunk
        pos = 0
        while (m := self._mark.search(self._buf, pos)) is not None:
            if m.group(1) != self._nonce:
                pos = m.start() + 1  # another hex run: no marker starts here
                continue
            self.step = int(m.group(2))
            del self._buf[: m.end()]
            pos = 0
        if len(self._buf) > _KEEP_BYTES + self._keep:
            del self._buf[: len(self._buf) - _KEEP_BYTES - self._keep]

    def of(self, step: int) -> bytes:
        # Output before the first marker (a failing prelude) belongs to the first step.
        return bytes(self._buf) if self.step in (step, 0) else b""


def _tail(output: bytes, redactor: Redactor) -> str:
    text = output.decode("utf-8", "replace")
    text = redactor.redact(live_redactor().redact(text))
    return text[-TAIL_CHARS:].strip() or "(no output)"


# ------------------------------------------------------------------------ running


@dataclass
class _Shell:
    argv0: str = "bash"

    @property
    def bash(self) -> bool:
        return self.argv0 == "bash"


@dataclass
class _Segment:
    """How a run of serial steps in one shell ended."""

    state: ShellState | None = None
    no_shell: bool = False


async def _run_segment(
    handle: Handle,
    shell: _Shell,
    steps: Sequence[Step],
    *,
    prelude: bytes | None,
    report: bool,
    env: Mapping[str, str],
    redactor: Redactor,
) -> _Segment:
    nonce = secrets.token_hex(16).encode()
    script = _script(steps, shell=shell.argv0, bash=shell.bash, report=report)
    argv = [shell.argv0, "-c", script, "corral-setup", "1"]
    if prelude is not None:
        argv.append("prelude")
    records = _Records(nonce)
    output = _Output(nonce)
    with exec_span(handle, "setup", steps=len(steps)):
        proc = await handle.process.spawn(argv, env=env)
        timed_out = False
        try:
            stdin = nonce + b"\n"
            if prelude is not None:  # bash reads it up to a NUL; sh up to EOF
                stdin += prelude + (b"\0" if shell.bash else b"")
            result, timed_out = await _watch(proc, stdin, steps, records, output)
        finally:
            aclose = getattr(proc, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()
    step_no = records.started
    if step_no == 0 and result.exit_code == _NO_BASH and shell.bash and not timed_out:
        return _Segment(no_shell=True)
    if timed_out:
        step = steps[max(step_no, 1) - 1]
        raise SetupError(step.run, "timed out", _tail(output.of(step_no), redactor))
    for i in range(1, len(steps) + 1):
        rc = records.ended.get(i)
        if rc == 0:
            continue
        step = steps[i - 1]
        tail = _tail(output.of(i), redactor)
        if rc is not None or not result.ok:
            # The shell exits with the step's status: its ExecResult also names a limit
            # the provider saw, or a signal that killed the shell itself.
            how = result.describe() if not result.ok else f"exit code {rc}"
            raise SetupError(step.run, how, tail)
        raise SetupError(step.run, "no shell state reported", tail)
    if not records.done:
        raise SetupError(steps[-1].run, "no shell state reported", _tail(output.of(len(steps)), redactor))
    if not report:
        return _Segment()
    parsed = _parse_report(records.state or b"")
    if parsed is None:
        raise SetupError(steps[-1].run, "no shell state reported", "(no output)")
    return _Segment(state=ShellState(cwd=parsed[0], env=parsed[1]))


async def _watch(
    proc: Process,
    stdin: bytes,
    steps: Sequence[Step],
    records: _Records,
    output: _Output,
) -> tuple[ExecResult, bool]:
    """Feed stdin, read both pipes, hold each step to its own timeout."""
    exited = anyio.Event()

    async def feed() -> None:
        try:
            await proc.write_stdin(stdin)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, BrokenPipeError):
            pass
        finally:
            try:
                await proc.close_stdin()
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, BrokenPipeError):
                pass

    def deadline(step_no: int) -> float:
        return anyio.current_time() + steps[min(max(step_no, 1), len(steps)) - 1].timeout

    settled = anyio.Event()  # both pipes at EOF, or the last record read

    async def read_records(scope: anyio.CancelScope) -> None:
        async for chunk in proc.stdout:
            for kind, i in records.feed(chunk):
                if kind == "S":
                    scope.deadline = deadline(i)
                elif kind == "E":
                    scope.deadline = deadline(i + 1)
                else:
                    scope.deadline = math.inf
            if records.done:
                settled.set()
                return  # a daemon a step started may hold the pipe open

    async def read_output() -> None:
        async for chunk in proc.stderr:
            output.feed(chunk)

    async def readers(scope: anyio.CancelScope) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(read_records, scope)
            tg.start_soon(read_output)
        settled.set()

    async def drain(tg: anyio.abc.TaskGroup) -> None:
        # What the shell wrote before it ended is in the pipes already; a daemon a step
        # started may keep them open for ever, so wait only a little for their EOF.
        await exited.wait()
        with anyio.move_on_after(_DRAIN_AFTER_EXIT):
            await settled.wait()
        tg.cancel_scope.cancel()

    with anyio.CancelScope(deadline=deadline(1)) as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(feed)
            tg.start_soon(readers, scope)
            tg.start_soon(drain, tg)
            await proc.wait()
            exited.set()
    if scope.cancelled_caught:
        with anyio.CancelScope(shield=True):
            await proc.kill(signal.SIGKILL)
            with anyio.move_on_after(5):
                async for chunk in proc.stderr:
                    output.feed(chunk)
            with anyio.move_on_after(5):
                await proc.wait()
        return ExecResult(exit_code=-1, stdout=b"", stderr=b"", timed_out=True), True
    return await proc.wait(), False


async def _baseline(handle: Handle, env: Mapping[str, str]) -> dict[str, str]:
    """The environment a fresh shell starts with (what a state's prelude is relative to)."""
    probe = await handle.process.exec(["/bin/sh", "-c", "printf '\\0'; env -0"], env=env, timeout=60)
    report = _parse_report(probe.stdout) if probe.ok else None
    if report is None:
        raise CorralError(
            f"sandbox {handle.id!r} cannot run /bin/sh for setup ({probe.describe()}): "
            f"{probe.stderr.decode('utf-8', 'replace')[-500:]}"
        )
    return report[1]


async def run_setup(
    handle: Handle,
    plan: Sequence[SetupItem],
    *,
    env: Mapping[str, str],
    redactor: Redactor,
) -> None:
    """Run ``plan`` in ``handle``; raise :class:`SetupError` at the first failure.

    ``env`` is the exec-time environment (secrets included) every step starts from.
    """
    shell = _Shell()
    state: ShellState | None = None  # None: a fresh shell's
    baseline: dict[str, str] | None = None
    items = list(plan)
    at = 0
    while at < len(items):
        serial: list[Step] = []
        while at < len(items) and isinstance(items[at], Step):
            serial.append(items[at])  # type: ignore[arg-type]
            at += 1
        group = items[at] if at < len(items) else None
        at += group is not None
        if serial:
            state = await _serial(handle, shell, serial, state, group is not None, env, redactor)
        if group is None:
            continue
        assert isinstance(group, Parallel)
        if baseline is None:
            baseline = await _baseline(handle, env)
        start = state or ShellState(env=dict(baseline))
        start = ShellState(cwd=start.cwd, env=start.env, baseline=baseline)
        state = start
        await _parallel(handle, shell, group, start, env, redactor)


async def _serial(
    handle: Handle,
    shell: _Shell,
    steps: list[Step],
    state: ShellState | None,
    report: bool,
    env: Mapping[str, str],
    redactor: Redactor,
) -> ShellState | None:
    prelude = state.prelude() if state is not None else None
    seg = await _run_segment(handle, shell, steps, prelude=prelude, report=report, env=env,
                             redactor=redactor)
    if seg.no_shell:  # no bash in this sandbox: the plan runs in /bin/sh
        shell.argv0 = "/bin/sh"
        seg = await _run_segment(handle, shell, steps, prelude=prelude, report=report, env=env,
                                 redactor=redactor)
    return seg.state if report else state


async def _parallel(
    handle: Handle,
    shell: _Shell,
    group: Parallel,
    start: ShellState,
    env: Mapping[str, str],
    redactor: Redactor,
) -> None:
    errors: list[tuple[int, SetupError]] = []

    async def one(i: int, step: Step) -> None:
        try:
            await _serial(handle, shell, [step], start, False, env, redactor)
        except SetupError as exc:
            errors.append((i, exc))

    async with anyio.create_task_group() as tg:
        for i, step in enumerate(group.steps):
            tg.start_soon(one, i, step)
    if errors:
        errors.sort(key=lambda e: e[0])
        first = errors[0][1]
        if len(errors) > 1:
            others = ", ".join(f"`{e.step}`" for _, e in errors[1:])
            first.add_note(f"also failed in the same parallel group: {others}")
        raise first
