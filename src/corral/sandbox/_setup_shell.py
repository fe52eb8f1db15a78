"""Run a setup plan in a sandbox: serial steps share ``cd``/``export``; groups run at once.

Works over plain ``exec`` on every provider. Each step is one ``bash -c`` (``sh`` when the
sandbox has no bash) that first restores the shell state left by the previous serial
step, then ``eval``s the step in the current shell (so ``cd`` and ``export`` stick), and
finally reports ``pwd`` and ``env -0`` on stdout. The step's own stdout goes to stderr,
so stdout carries nothing but the report. The state is handed over on stdin (a pipe):
never a file, never argv, so secret values in the environment stay off the disk.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import anyio

from corral._errors import CorralError
from corral.sandbox._contracts import ExecResult, Handle
from corral.sandbox._redact import Redactor, live_redactor
from corral.sandbox._workspace import Parallel, SetupItem, Step

__all__ = ["SetupError", "ShellState", "run_setup"]

TAIL_CHARS = 2000

# Variables the shell manages itself; carrying them over would be wrong or fail.
_SHELL_OWNED = frozenset(
    {
        "PWD", "OLDPWD", "SHLVL", "_", "SHELLOPTS", "BASHOPTS", "BASH_VERSINFO", "EUID",
        "UID", "PPID", "BASHPID", "GROUPS", "BASH_ARGV", "BASH_ARGC", "BASH_LINENO",
        "BASH_SOURCE", "FUNCNAME", "BASH_EXECUTION_STRING", "BASH_COMMAND", "BASH",
        "BASH_VERSION", "BASH_SUBSHELL", "RANDOM", "LINENO", "SECONDS",
    }
)  # fmt: skip

# The report goes to the original stdout (fd 3), also when the step calls `exit`: the
# EXIT trap runs in the step's shell, with its cwd and exports.
_SCRIPT = r"""
exec 3>&1
__corral_report() {
  __corral_rc=$?
  { pwd; printf '\0'; env -0; } >&3
  exit $__corral_rc
}
__corral_step=$1
__corral_state=$(cat) || exit 96
eval "$__corral_state" || exit 96
unset __corral_state
trap __corral_report EXIT
eval "$__corral_step" </dev/null 1>&2 3>&-
"""


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
    """The serial shell's state between steps."""

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


def _tail(result: ExecResult, redactor: Redactor) -> str:
    text = result.stderr.decode("utf-8", "replace")
    text = redactor.redact(live_redactor().redact(text))
    return text[-TAIL_CHARS:].strip() or "(no output)"


async def _shell(handle: Handle, env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    probe = await handle.process.exec(
        ["/bin/sh", "-c", "command -v bash || true; printf '\\0'; env -0"], env=env, timeout=60
    )
    if not probe.ok:
        raise CorralError(
            f"sandbox {handle.id!r} cannot run /bin/sh for setup ({probe.describe()}): "
            f"{probe.stderr.decode('utf-8', 'replace')[-500:]}"
        )
    report = _parse_report(probe.stdout)
    assert report is not None
    bash, baseline = report
    shell = bash.strip() or "/bin/sh"
    return [shell, "-c", _SCRIPT, "corral-setup"], baseline


async def _run_step(
    handle: Handle,
    shell: list[str],
    step: Step,
    state: ShellState,
    env: Mapping[str, str],
    redactor: Redactor,
) -> ShellState:
    result = await handle.process.exec(
        [*shell, step.run], env=env, stdin=state.prelude(), timeout=step.timeout
    )
    if not result.ok:
        raise SetupError(step.run, result.describe(), _tail(result, redactor))
    report = _parse_report(result.stdout)
    if report is None:
        raise SetupError(step.run, "no shell state reported", _tail(result, redactor))
    cwd, new_env = report
    return ShellState(cwd=cwd, env=new_env, baseline=state.baseline)


async def run_setup(
    handle: Handle,
    plan: Sequence[SetupItem],
    *,
    env: Mapping[str, str],
    redactor: Redactor,
) -> ShellState:
    """Run ``plan`` in ``handle``; raise :class:`SetupError` at the first failure.

    ``env`` is the exec-time environment (secrets included) every step starts from.
    """
    state = ShellState()
    if not plan:
        return state
    shell, baseline = await _shell(handle, env)
    state = ShellState(env=dict(baseline), baseline=baseline)
    for item in plan:
        if isinstance(item, Step):
            state = await _run_step(handle, shell, item, state, env, redactor)
            continue
        assert isinstance(item, Parallel)
        errors: list[tuple[int, SetupError]] = []

        async def one(
            i: int,
            step: Step,
            start: ShellState = state,
            errors: list[tuple[int, SetupError]] = errors,
        ) -> None:
            try:
                await _run_step(handle, shell, step, start, env, redactor)
            except SetupError as exc:
                errors.append((i, exc))

        async with anyio.create_task_group() as tg:
            for i, step in enumerate(item.steps):
                tg.start_soon(one, i, step)
        if errors:
            errors.sort(key=lambda e: e[0])
            first = errors[0][1]
            if len(errors) > 1:
                others = ", ".join(f"`{e.step}`" for _, e in errors[1:])
                first.add_note(f"also failed in the same parallel group: {others}")
            raise first
    return state
