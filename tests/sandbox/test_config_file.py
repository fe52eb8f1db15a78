"""corral.toml: load, errors with key and line, round trip; definitions validate."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral import (
    ConfigError,
    Files,
    GitSource,
    Lifecycle,
    LocalDir,
    Policy,
    Sandbox,
    Secrets,
    Workspace,
    dump_config,
    load_config,
    parallel,
)
from corral.sandbox._config_file import find_config, locate_key

FULL = """\
id = "triage-bot"

[provider]
name = "bubblewrap"

[workspace]
instructions = "Fix the failing test.\\nBe brief."
setup = ["cd app", "export CI=1", { parallel = ["make a", "make b"] }, { run = "make all", timeout = "1h" }]

[workspace.source]
url = "https://example.org/repo.git"
ref = "main"
depth = 5
auth = "GIT_TOKEN"

[workspace.scripts]
test = "pytest -q"
lint = "ruff check ."

[secrets]
GIT_TOKEN = { env = "HOST_GIT_TOKEN" }

[policy]
allow = ["pytest *", "ruff *"]
ask = ["git push *"]
deny = ["rm -rf *"]
default = "deny"
network = "allow"
allow_hosts = ["pypi.org", "*.pythonhosted.org", "api.example.com:8443"]

[lifecycle]
reuse = "run"
snapshot = "after-setup"
keep_alive = "2h"
destroy_on_complete = true
"""
ENV = {"HOST_GIT_TOKEN": "tok-123456789"}


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "corral.toml"
    p.write_text(text)
    return p


def test_full_definition_loads(tmp_path: Path) -> None:
    sb = load_config(write(tmp_path, FULL), environ=ENV)
    assert sb.id == "triage-bot"
    assert sb.provider_name == "bubblewrap"
    src = sb.workspace.source
    assert isinstance(src, GitSource) and (src.ref, src.depth, src.auth) == ("main", 5, sb.secrets.GIT_TOKEN)
    assert sb.workspace.steps[2] == parallel("make a", "make b")
    assert sb.workspace.steps[3].timeout == 3600.0  # type: ignore[union-attr]
    assert sb.policy.default == "deny" and sb.policy.egress
    assert sb.policy.allow_hosts == ("pypi.org", "*.pythonhosted.org", "api.example.com:8443")
    assert not sb.policy.direct_network  # the hosts are reached through the egress proxy
    assert sb.lifecycle == Lifecycle(reuse="run", snapshot="after-setup", keep_alive=7200, destroy_on_complete=True)
    assert sb.secrets.resolve("GIT_TOKEN") == "tok-123456789"


def test_round_trip(tmp_path: Path) -> None:
    sb = load_config(write(tmp_path, FULL), environ=ENV)
    text = dump_config(sb)
    assert "tok-123456789" not in text
    again = load_config(write(tmp_path, text), environ=ENV)
    assert again.to_dict() == sb.to_dict()
    assert again.workspace.hash() == sb.workspace.hash()


def test_round_trip_of_other_sources(tmp_path: Path) -> None:
    for source in (
        LocalDir(str(tmp_path)),
        Files({"a.txt": "hi\n", "bin/x": b"\x00\x01"}),
        None,
    ):
        sb = Sandbox(provider="local", workspace=Workspace(source=source))
        again = load_config(write(tmp_path, dump_config(sb)))
        assert again.to_dict() == sb.to_dict()


@pytest.mark.parametrize(
    ("text", "key", "line"),
    [
        ("[workspace]\nsetup = []\nsetpu = []\n", "workspace.setpu", 3),
        ("[workspace.source]\nurl = 'x'\nbrnach = 'main'\n", "workspace.source.brnach", 3),
        ("[workspace]\nsource = { url = 'x', brnach = 'main' }\n", "workspace.source.brnach", 2),
        ("id = 'x'\n\n[lifecycle]\nreuse = 'thread'\nkeepalive = '1h'\n", "lifecycle.keepalive", 5),
        ("[policy]\nallow = []\n[polcy]\n", "polcy", 3),
        ("\n\nfoo = 1\n", "foo", 3),
        ("[policy]\ndefualt = 'ask'\n", "policy.defualt", 2),
    ],
)
def test_unknown_key_names_key_and_line(tmp_path: Path, text: str, key: str, line: int) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert f"{path}:{line}:" in msg
    assert f"unknown key '{key}'" in msg


@pytest.mark.parametrize(
    ("text", "field", "line"),
    [
        ("[lifecycle]\nreuse = 'sometimes'\n", "lifecycle.reuse", 2),
        ("[policy]\n\ndefault = 'maybe'\n", "policy.default", 3),
        ("[lifecycle]\nkeep_alive = 'forever'\n", "lifecycle.keep_alive", 2),
        ("[workspace.source]\nurl = 'https://u:p@h/x.git'\n", "workspace.source.url", 2),
        ("[workspace.source]\nurl = 'x'\ncommit = 'abc'\n", "workspace.source.commit", 3),
        ("[policy]\nnetwork = 'allow'\nallow_hosts = ['pypi.org', 'a b']\n",
         "policy.allow_hosts[1]", 3),
        ("[policy]\n\nallow_hosts = ['pypi.org']\n", "policy.allow_hosts", 3),
    ],
)
def test_bad_values_name_field_and_line(tmp_path: Path, text: str, field: str, line: int) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(f"{path}:{line}: {field}")


def test_invalid_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="invalid TOML.*line 1"):
        load_config(write(tmp_path, "id = = 1\n"))
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "nope.toml")


def test_missing_secret_env_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="HOST_GIT_TOKEN is not set"):
        load_config(write(tmp_path, FULL), environ={})


def test_relative_local_path_is_relative_to_the_file(tmp_path: Path) -> None:
    (tmp_path / "proj").mkdir()
    sb = load_config(write(tmp_path, "[workspace.source]\npath = 'proj'\n"))
    assert sb.workspace.source == LocalDir(str(tmp_path / "proj"))


def test_find_config_walks_up(tmp_path: Path) -> None:
    write(tmp_path, "id = 'x'\n")
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    assert find_config(deep) == tmp_path / "corral.toml"


def test_locate_key_handles_dotted_and_quoted_keys() -> None:
    text = '[a]\n"b" = 1\nc.d = 2\n[a.e]\nf = 3\n'
    assert locate_key(text, ("a", "b")) == 2
    assert locate_key(text, ("a", "c", "d")) == 3
    assert locate_key(text, ("a", "e", "f")) == 5
    assert locate_key(text, ("zzz",)) is None


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: Sandbox(id="bad id"), "sandbox.id"),
        (lambda: Sandbox(workspace="x"), "sandbox.workspace"),  # type: ignore[arg-type]
        (lambda: Workspace(setup="make"), "workspace.setup"),
        (lambda: Workspace(setup=[{"parallel": []}]), "workspace.setup"),
        (lambda: Workspace(scripts={"t": 1}), "workspace.scripts.t"),  # type: ignore[dict-item]
        (lambda: GitSource(url=""), "workspace.source.url"),
        (lambda: GitSource(url="x", ref="bad..ref"), "workspace.source.ref"),
        (lambda: GitSource(url="x", depth=0), "workspace.source.depth"),
        (lambda: Files({"../x": "y"}), "workspace.source.files"),
        (lambda: Lifecycle(snapshot="sometimes"), "lifecycle.snapshot"),  # type: ignore[arg-type]
        (lambda: Lifecycle(keep_alive=-1), "lifecycle.keep_alive"),
        (
            lambda: Workspace(source=GitSource(url="x", auth=Secrets(A="value-1").A)),
            "workspace.source.auth",
        ),
        (lambda: Policy(deny=[""]), "policy.deny[0]"),
    ],
)
def test_definitions_validate_when_built(build: object, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        build()  # type: ignore[operator]
    assert str(err.value).startswith(field), str(err.value)


def test_lifecycle_defaults() -> None:
    assert Lifecycle().destroy_on_complete is False
    assert Lifecycle(reuse="none").destroy_on_complete is True
    assert Lifecycle(reuse="none", destroy_on_complete=False).destroy_on_complete is False
    assert Lifecycle(keep_alive="90m").keep_alive_seconds == 5400.0
    assert Lifecycle(keep_alive=None).keep_alive_seconds is None
