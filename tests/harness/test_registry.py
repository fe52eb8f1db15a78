"""The harness registry: names → factories with typed configs, entry points, what a run
records of its harness's package."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from corral._errors import ConfigError
from corral.harness import (
    CommandHarness,
    build_harness,
    harness_names,
    register_harness,
    unregister_harness,
)
from corral.harness._registry import BUILTIN, GROUP, HarnessNotInstalled, registration
from corral._version import __version__
from tests.plugins.plug_harness import PlugShHarness

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def plug() -> Iterator[None]:
    register_harness("plug-sh", PlugShHarness, package="corral-plug-harness")
    yield
    unregister_harness("plug-sh")


def test_the_builtins_are_declared_as_entry_points() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert declared[GROUP] == dict(BUILTIN)
    assert set(BUILTIN) <= set(harness_names())
    assert registration("codex").recorded() == {"name": "corral", "version": __version__}


def test_an_unknown_harness_says_how_to_get_one() -> None:
    with pytest.raises(HarnessNotInstalled) as caught:
        build_harness("codec", {})
    msg = str(caught.value)
    assert "\n" not in msg and isinstance(caught.value, ConfigError)
    assert "unknown harness 'codec' (did you mean 'codex'?)" in msg and GROUP in msg
    assert "register_harness('codec', factory)" in msg


def test_a_run_s_recorded_package_is_named_where_its_harness_is_missing() -> None:
    with pytest.raises(HarnessNotInstalled, match=r"install the package 'corral-x' 1\.2"):
        build_harness("x-sh", {}, recorded={"name": "corral-x", "version": "1.2"})
    with pytest.raises(HarnessNotInstalled, match="only the process that started the run "
                                                  "registered it"):
        build_harness("x-sh", {}, recorded={"name": "app", "in_process": True})


def test_a_registered_harness_is_built_with_its_typed_config(plug: None) -> None:
    harness = build_harness("plug-sh", {"model": "blue"})
    assert isinstance(harness, PlugShHarness) and harness.tag == "blue"
    reg = registration("plug-sh")
    assert reg.recorded() == {"name": "corral-plug-harness", "in_process": True}
    # its model refuses unknown keys (extra="forbid"), naming the ones it takes
    with pytest.raises(ConfigError) as caught:
        build_harness("plug-sh", {"modle": "blue"})
    assert "unknown key 'modle' (did you mean 'model'?) for harness 'plug-sh' " \
           "(accepted keys: model)" in str(caught.value)
    with pytest.raises(ConfigError, match=r"^harness 'plug-sh': model: Input should be"):
        build_harness("plug-sh", {"model": 3})


def test_the_builtins_check_their_configs() -> None:
    with pytest.raises(ConfigError, match="the command harness needs a command"):
        build_harness("command", {"argv": "ls"})
    # the command harness ignores options it does not take, as before
    assert isinstance(build_harness("command", {"argv": ["ls"], "model": "m"}), CommandHarness)
    with pytest.raises(ConfigError, match="harness 'codex': version: Input should be"):
        build_harness("codex", {"version": 3})
    with pytest.raises(ConfigError, match="opencode: 'model' must be a string"):
        build_harness("opencode", {"model": 3})
    with pytest.raises(ConfigError, match="acp: 'agent' must be a non-empty string"):
        build_harness("acp", {"agent": ""})


def test_a_factory_without_a_model_gets_the_mapping(plug: None) -> None:
    seen: list[Mapping[str, Any]] = []

    def factory(config: Mapping[str, Any]) -> CommandHarness:
        seen.append(config)
        return CommandHarness(["true"])

    register_harness("plain", factory)
    try:
        build_harness("plain", {"argv": ["x"], "anything": 1})
    finally:
        unregister_harness("plain")
    assert seen == [{"argv": ["x"], "anything": 1}]


def test_bad_registrations_are_refused() -> None:
    with pytest.raises(ConfigError, match="harness name"):
        register_harness("no spaces", PlugShHarness)
    with pytest.raises(ConfigError, match="must subclass corral.harness.HarnessConfig"):
        register_harness("bad", PlugShHarness, config=dict)  # type: ignore[arg-type]
