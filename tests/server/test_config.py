"""Server configuration: named sandbox definitions, inline workspaces under allowed roots,
and configuration mistakes reported as one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral._errors import ConfigError
from corral.server._config import ServerConfig, is_loopback, load_config_file
from tests.server.conftest import Home, read_stream


def test_named_and_inline_sandboxes(home: Home, tmp_path: Path) -> None:
    roots = tmp_path / "roots"
    named = roots / "named"
    inline = roots / "inline"
    for d, text in ((named, "from the named sandbox"), (inline, "from an inline workspace")):
        d.mkdir(parents=True)
        (d / "note.txt").write_text(text)
    config = tmp_path / "serve.toml"
    config.write_text(
        f'default_sandbox = "repo"\nworkspace_roots = ["{roots}"]\n'
        f'[sandboxes.repo]\nprovider = "bubblewrap"\nworkspace = "{named}"\n'
    )
    with home.server("--config", str(config)) as server:
        by_name = server.start(["cat", "note.txt"], sandbox="repo")["run_id"]
        by_default = server.start(["cat", "note.txt"])["run_id"]
        by_inline = server.start(["cat", "note.txt"], sandbox={"workspace": str(inline)})["run_id"]
        escape = str(roots / ".." / "serve.toml")
        with server.client() as c:
            refused = c.post("/v1/runs", json={"thread_id": "t", "command": ["true"],
                                               "sandbox": {"workspace": escape}})
        assert refused.status_code == 400 and "workspace_roots" in refused.text
        for run_id, text in ((by_name, "from the named sandbox"),
                             (by_default, "from the named sandbox"),
                             (by_inline, "from an inline workspace")):
            got, ended = read_stream(server, run_id)
            assert ended
            assert "".join(e.get("delta", "") for _, e in got) == text, run_id


def test_config_mistakes(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    cases = {
        "nope = 1\n": "unknown key",
        "[sandboxes.x]\nimage = 'y'\n": "unknown key",
        "[sandboxes.x]\nworkspace = '/does/not/exist'\n": "not a directory",
        "allowed_providers = 'local'\n": "list of strings",
        "= broken": "invalid TOML",
        "[sandboxes.x]\npolicy = 'ask'\n": r"\[sandboxes.x.policy\] must be a table",
        "[sandboxes.x.policy]\nshell = 'yes'\n": r"\[sandboxes.x.policy\]: .*shell",
        "[sandboxes.x.policy]\ndefault = 'maybe'\n": r"\[sandboxes.x.policy\]: .*maybe",
    }
    for text, words in cases.items():
        bad.write_text(text)
        with pytest.raises(ConfigError, match=words):
            load_config_file(bad)
    bad.write_text("[sandboxes.x.policy]\nask = ['git push *']\ndefault = 'deny'\n")
    policy = load_config_file(bad)["sandboxes"]["x"].policy
    assert list(policy["ask"]) == ["git push *"] and policy["default"] == "deny"
    with pytest.raises(ConfigError, match="no such file"):
        load_config_file(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="default_sandbox"):
        ServerConfig(default_sandbox="ghost").validate()


def test_loopback_names() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.1", "example.com", ""))


def test_serve_is_a_corral_command() -> None:
    from corral.cli._main import COMMANDS, build_parser
    from corral.server import config_from_args
    from corral.server._serve_cli import serve_main

    parser = build_parser({"serve": COMMANDS["serve"]})
    args = parser.parse_args(["serve", "--port", "0", "--no-reaper", "--reap-ttl", "10m"])
    assert args.func is serve_main
    config = config_from_args(args)
    assert (config.port, config.reaper, config.reap_ttl) == (0, False, 600.0)
    with pytest.raises(ConfigError, match="--reap-interval"):
        config_from_args(parser.parse_args(["serve", "--reap-interval", "soon"]))
