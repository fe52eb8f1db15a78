"""A secret's file is checked before it is read.

Attack: ``[secrets] T = { file = "/dev/zero" }`` (in a file given with ``--config``, or in
a repository's own corral.toml, which was read before the trust check refused it) grew
the root ``corral`` process until memory ran out; a FIFO or ``/dev/stdin`` hung
``corral run`` forever.

Defence: only a regular file is read (a device is not even opened; a FIFO swapped in is
opened without blocking and refused), at most 64 KiB of it, as UTF-8; each refusal is one
line naming the secret and the file. The CLI runs under a 1 GiB address-space limit here
so that a regression fails the test instead of the machine.
"""

from __future__ import annotations

import os
import resource
import subprocess
from pathlib import Path

import pytest

from tests.helpers import one_line_refusal

from corral._errors import ConfigError
from corral.sandbox._secrets import Secrets

MEMORY = 1 << 30
MAX_SECRET_FILE = 64 * 1024  # the promise, written out


def _bounded() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def corral_run(corral_cmd: list[str], cli_env: dict[str, str], config: Path | None,
               workspace: Path) -> subprocess.CompletedProcess[str]:
    """``corral run`` with stdin a pipe nobody writes to or closes (``/dev/stdin`` as a
    secret would wait on it forever), in bounded time and memory."""
    argv = [*corral_cmd, "run", *(["--config", str(config)] if config else []),
            "--workspace", str(workspace), "--", "true"]
    with subprocess.Popen(argv, env=cli_env, cwd=workspace, stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          preexec_fn=_bounded) as proc:
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    d = tmp_path / "ws"
    d.mkdir()
    return d


def _bad_sources(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """name -> (the file's TOML value, what the refusal says)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big"
    big.write_bytes(b"a" * (MAX_SECRET_FILE + 1))
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe token")
    return {
        "dev-zero": ('"/dev/zero"', "is not a regular file"),
        "fifo": (f'"{fifo}"', "is not a regular file"),
        "stdin": ('"/dev/stdin"', "is not a regular file"),
        "directory": (f'"{tmp_path}"', "is not a regular file"),
        "too-big": (f'"{big}"', f"more than {MAX_SECRET_FILE} bytes"),
        "not-utf8": (f'"{binary}"', "is not UTF-8 text"),
        "missing": (f'"{tmp_path / "nope"}"', "No such file or directory"),
        "not-a-string": ("5", "file must be a non-empty string"),
    }


@pytest.mark.parametrize("case", ["dev-zero", "fifo", "stdin", "directory", "too-big",
                                  "not-utf8", "missing", "not-a-string"])
def test_a_secret_file_that_is_no_small_text_file_is_refused_in_one_line(
        case: str, tmp_path: Path, workspace: Path, corral_cmd: list[str],
        cli_env: dict[str, str]) -> None:
    value, says = _bad_sources(tmp_path)[case]
    config = tmp_path / "corral.toml"
    config.write_text(f"[secrets]\nT = {{ file = {value} }}\n")
    one_line_refusal(corral_run(corral_cmd, cli_env, config, workspace), "secrets.T", says)


def test_a_repositorys_corral_toml_cannot_hang_or_exhaust_corral(
        workspace: Path, corral_cmd: list[str], cli_env: dict[str, str]) -> None:
    """The repository's own file, found in the workspace: refused in one line too, before
    the check of where a repository may read from even runs."""
    os.mkfifo(workspace / "pipe")
    for value in ("/dev/zero", str(workspace / "pipe")):
        (workspace / "corral.toml").write_text(f'[secrets]\nT = {{ file = "{value}" }}\n')
        one_line_refusal(corral_run(corral_cmd, cli_env, None, workspace), "secrets.T")


def test_a_users_own_secret_file_still_works(tmp_path: Path) -> None:
    """A symlink to a regular file (a secrets mount, a dotfile) is the user's own choice;
    a file of exactly the limit is read; trailing newlines go."""
    token = tmp_path / "token"
    token.write_text("a" * (MAX_SECRET_FILE - 1) + "\n")
    link = tmp_path / "link"
    link.symlink_to(token)
    secrets = Secrets.from_sources({"T": {"file": str(link)}})
    assert secrets.env() == {"T": "a" * (MAX_SECRET_FILE - 1)}
    with pytest.raises(ConfigError, match="secrets.T: .*is not a regular file"):
        Secrets.from_sources({"T": {"file": "/dev/null"}})
