"""Bad input and exhausted resources: each is one clear error line, never a traceback.

Every case runs the real ``corral`` CLI in a subprocess (``python -m corral``) and checks:
a non-zero exit, exactly one line on stderr (``corral: error: ...``) naming what was wrong,
no ``Traceback``, and nothing half-written to the store. The read-only and full
``CORRAL_HOME`` cases use real tmpfs mounts (root only; a named skip otherwise).
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from corral.testing._plugin import require
from tests.server.conftest import Home

pytestmark = pytest.mark.timeout(120)

Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def corral(corral_cmd: list[str], cli_env: dict[str, str]) -> Run:
    """``corral ARGS`` in a subprocess; keyword ``home=`` overrides ``CORRAL_HOME``."""

    def run(*args: str, home: Path | None = None, cwd: Path | None = None
            ) -> subprocess.CompletedProcess[str]:
        env = dict(cli_env)
        env.pop("CORRAL_STORE", None)
        if home is not None:
            env["CORRAL_HOME"] = str(home)
        return subprocess.run([*corral_cmd, *args], env=env, capture_output=True, text=True,
                              timeout=90, cwd=cwd, check=False)

    return run


def one_error_line(out: subprocess.CompletedProcess[str], *needles: str) -> str:
    """The single ``corral: error: ...`` line of a failed command (asserted), which must
    contain every needle."""
    assert out.returncode != 0, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr[-4000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr[-4000:]
    line = lines[0]
    assert line.startswith("corral: error: "), line
    for needle in needles:
        assert needle in line, (needle, line)
    return line


def runs_in(db: Path) -> list[str]:
    with sqlite3.connect(db) as conn:
        return [r[0] for r in conn.execute("SELECT run_id FROM runs ORDER BY seq")]


# ----------------------------------------------------------------------------- corral.toml


def test_deeply_nested_toml_is_one_line(corral: Run, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "corral.toml").write_text("a = " + "[" * 100_000)
    out = corral("run", "--provider", "local", "--workspace", str(ws), "--", "true")
    one_error_line(out, str(ws / "corral.toml"), "nested")


def test_deeply_nested_server_config_is_one_line(tmp_path: Path) -> None:
    from corral._errors import ConfigError
    from corral.server._config import load_config_file

    conf = tmp_path / "serve.toml"
    conf.write_text("x = " + "{ a = " * 50_000)
    with pytest.raises(ConfigError, match="nested"):
        load_config_file(conf)


def test_a_50_mb_corral_toml_is_refused_before_anything_is_stored(
        corral: Run, tmp_path: Path, corral_home: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    with (ws / "corral.toml").open("w") as f:
        f.write('id = "big"\n[workspace]\ninstructions = """')
        chunk = "y" * (1 << 20)
        for _ in range(50):
            f.write(chunk)
        f.write('"""\n')
    out = corral("run", "--provider", "local", "--run-id", "big", "--workspace", str(ws),
                 "--", "true")
    one_error_line(out, str(ws / "corral.toml"), "1 MiB")
    db = corral_home / "corral.db"
    assert not db.exists() or runs_in(db) == []


def test_the_stored_definition_is_limited_too(corral: Run, tmp_path: Path,
                                              corral_home: Path) -> None:
    """A file under the size limit whose definition grows when stored (non-ASCII text is
    six bytes of JSON per character) is refused before a record is written."""
    from corral.stores._protocols import MAX_SPEC_BYTES
    from corral.sandbox._config_file import MAX_CONFIG_BYTES

    ws = tmp_path / "ws"
    ws.mkdir()
    text = "\u00e9" * ((MAX_CONFIG_BYTES - 100) // 2)
    (ws / "corral.toml").write_text(f'id = "wide"\n[workspace]\ninstructions = "{text}"\n',
                                    encoding="utf-8")
    assert (ws / "corral.toml").stat().st_size <= MAX_CONFIG_BYTES
    out = corral("run", "--provider", "local", "--run-id", "wide", "--workspace", str(ws),
                 "--", "true")
    one_error_line(out, "definition", f"{MAX_SPEC_BYTES >> 20} MiB")
    db = corral_home / "corral.db"
    assert not db.exists() or runs_in(db) == []


# ----------------------------------------------------------------------------- store URL


def test_sqlite_url_in_a_missing_directory_is_refused(corral: Run, tmp_path: Path) -> None:
    missing = tmp_path / "missing" / "dir"
    out = corral("ls", "--store", f"sqlite://{missing}/x.db")
    one_error_line(out, str(missing), "does not exist")
    assert not (tmp_path / "missing").exists()


def test_the_default_store_is_still_created(corral: Run, tmp_path: Path) -> None:
    home = tmp_path / "fresh-home"  # does not exist yet
    out = corral("ls", "--json", home=home)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [] and (home / "corral.db").is_file()


# ----------------------------------------------------------------------------- run ids

BAD_IDS = ["../x", "a/b", "x" * 5000, "", "-leading-dash", "sp ace", "nul\x01"]
GOOD_IDS = ["r-1", "run.2:x@host", "Z" * 128]


def test_one_id_rule_for_the_cli_and_the_server(corral: Run, corral_home: Path,
                                                tmp_path: Path) -> None:
    from corral._ids import ID_PATTERN, valid_id

    for bad in BAD_IDS:
        assert not valid_id(bad)
        for flag in ("--run-id", "--thread"):
            out = corral("run", "--provider", "local", f"{flag}={bad}", "--", "true")
            one_error_line(out, flag, "not allowed")
    db = corral_home / "corral.db"
    assert not db.exists() or runs_in(db) == []
    for good in GOOD_IDS:
        assert valid_id(good)
    out = corral("run", "--provider", "local", "--run-id", GOOD_IDS[2], "--thread",
                 GOOD_IDS[1], "--", "true")
    assert out.returncode == 0, out.stderr
    assert runs_in(db) == [GOOD_IDS[2]]

    # the server refuses exactly the same ids (a real server process)
    server_home = tmp_path / "server-home"
    server_home.mkdir()
    with Home(server_home).server() as server, server.client() as c:
        for bad in BAD_IDS:
            for field in ("run_id", "thread_id"):
                body = {"thread_id": "t", "command": ["true"], field: bad}
                r = c.post("/v1/runs", json=body)
                assert r.status_code == 422, (field, bad[:20], r.text[:300])
        # one rule, in one place: the server's schema pattern is corral._ids'
        props = c.get("/openapi.json").json()["components"]["schemas"]["StartRun"]["properties"]
        for field in ("run_id", "thread_id"):
            assert ID_PATTERN in json.dumps(props[field]), props[field]


# ----------------------------------------------------------------------------- CORRAL_HOME


@pytest.fixture
def tmpfs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Path]]:
    """``mount()`` gives a fresh 1 MiB tmpfs (unmounted at the end)."""
    require(request.config, os.geteuid() == 0, "root (to mount a tmpfs)", "run as root")
    mounted: list[Path] = []

    def mount() -> Path:
        d = tmp_path / f"fs{len(mounted)}"
        d.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(d)],
                       check=True)
        mounted.append(d)
        return d

    yield mount
    for d in reversed(mounted):
        subprocess.run(["umount", str(d)], check=False)
        if os.path.ismount(d):
            subprocess.run(["umount", "-l", str(d)], check=False)


def remount_read_only(d: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(d)], check=True)


def fill(d: Path) -> Path:
    """Fill the file system holding ``d`` to the last byte; returns the filler file."""
    filler = d / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    block = b"\0" * 4096
    try:
        while True:
            try:
                os.write(fd, block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
        for size in (512, 64, 1):  # the last partial block
            while True:
                try:
                    os.write(fd, block[:size])
                except OSError:
                    break
    finally:
        os.close(fd)
    assert os.statvfs(d).f_bavail == 0
    return filler


COMMANDS = [
    ("exec", "--provider", "local", "--", "true"),
    ("run", "--provider", "local", "--", "true"),
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_read_only_corral_home(command: tuple[str, ...], corral: Run,
                               tmpfs: Callable[[], Path]) -> None:
    home = tmpfs()
    remount_read_only(home)
    one_error_line(corral(*command, home=home), str(home), "read-only")
    # a home below a read-only directory (it cannot be created)
    one_error_line(corral(*command, home=home / "sub"), str(home), "read-only")


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_read_only_corral_home_with_a_store(command: tuple[str, ...], corral: Run,
                                            tmpfs: Callable[[], Path]) -> None:
    home = tmpfs()
    first = corral("run", "--provider", "local", "--run-id", "before", "--", "true", home=home)
    assert first.returncode == 0, first.stderr
    remount_read_only(home)
    one_error_line(corral(*command, home=home), str(home), "read-only")


def full_home_outcome(command: tuple[str, ...], out: subprocess.CompletedProcess[str],
                      home: Path) -> None:
    """``corral run`` needs room in a full home (store, journal) and fails in one line.
    ``corral exec`` of ``true`` on the local provider writes no file data there (create is
    a mkdir and a setxattr, the areas are empty directories): it may simply work, and
    then says nothing; if it fails, it fails in one line."""
    if command[0] == "exec" and out.returncode == 0:
        assert out.stderr == "", out.stderr[-4000:]
        return
    one_error_line(out, str(home), "full")


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_full_corral_home(command: tuple[str, ...], corral: Run,
                          tmpfs: Callable[[], Path]) -> None:
    home = tmpfs()
    fill(home)
    full_home_outcome(command, corral(*command, home=home), home)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_full_corral_home_with_a_store(command: tuple[str, ...], corral: Run,
                                       tmpfs: Callable[[], Path]) -> None:
    home = tmpfs()
    first = corral("run", "--provider", "local", "--run-id", "before", "--", "true", home=home)
    assert first.returncode == 0, first.stderr
    filler = fill(home)
    full_home_outcome(command, corral(*command, home=home), home)
    filler.unlink()
    # nothing half-written: the store holds exactly the run from before, completed
    listed = corral("ls", "--json", home=home)
    assert listed.returncode == 0, listed.stderr
    assert [(r["run_id"], r["status"]) for r in json.loads(listed.stdout)] == [
        ("before", "completed")]

