"""The provider registry: names → factories with typed configs, entry points, records."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral import Lifecycle, RunContext, Sandbox
from corral._errors import ConfigError
from corral.abc import (
    Described,
    HostPaths,
    Provider,
    ProvidesSnapshots,
    PrunesOrphans,
    SandboxDirs,
)
from corral.providers import (
    ProviderConfig,
    get_provider,
    provider_names,
    register_provider,
    unregister_provider,
)
from corral.providers._bubblewrap import BubblewrapProvider
from corral.providers._local import LocalProvider
from corral.sandbox._gc import collect_idle
from corral.sandbox._key import KeyInput
from corral.sandbox._provider_registry import BUILTIN, GROUP
from corral.stores._memory import MemoryStore
from corral.stores._protocols import InstanceRecord
from tests.plugins.plug_provider import PlugProvider

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def plug(corral_home: Path) -> Iterator[None]:
    register_provider("plug", PlugProvider, package="corral-plug")
    yield
    unregister_provider("plug")


def ctx() -> RunContext:
    return RunContext(thread_id="t", run_id="r")


def test_the_builtins_are_declared_as_entry_points() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert declared[GROUP] == dict(BUILTIN)
    assert {"local", "bubblewrap"} <= set(provider_names())


def test_unknown_keys_are_refused_naming_the_accepted_ones() -> None:
    with pytest.raises(ConfigError) as caught:
        Sandbox(provider="local", provider_config={"hom": "/x"})
    assert str(caught.value) == (
        "unknown key 'provider.hom' (did you mean 'home'?) for provider 'local' "
        "(accepted keys: home)"
    )
    with pytest.raises(ConfigError, match=r"unknown key 'provider\.image'.*accepted keys: "
                                          r"home, limits, host_uid, bwrap"):
        Sandbox.from_dict({"provider": {"name": "bubblewrap", "image": "x"}})
    # a value the provider itself checks: its own one-line message
    with pytest.raises(ConfigError, match=r"^provider\.limits\.pids"):
        Sandbox(provider="bubblewrap", provider_config={"limits": {"pids": -1}})
    with pytest.raises(ConfigError, match="provider.host_uid"):
        get_provider("bubblewrap", host_uid="root")


def test_an_unknown_provider_says_how_to_get_one() -> None:
    with pytest.raises(ConfigError) as caught:
        Sandbox(provider="warp")
    msg = str(caught.value)
    assert "\n" not in msg
    assert "unknown provider 'warp'" in msg and f"group {GROUP!r}" in msg
    assert "register_provider('warp', factory)" in msg and "bubblewrap, docker, local" in msg


def test_a_registered_provider_is_built_with_its_typed_config(plug: None) -> None:
    sb = Sandbox(provider="plug", provider_config={"tag": "red"})
    provider = sb.get_provider()
    assert isinstance(provider, PlugProvider) and provider.tag == "red"
    assert isinstance(provider, Provider) and isinstance(provider, ProvidesSnapshots)
    assert sb.provider_record() == {"name": "plug", "config": {"tag": "red"},
                                    "package": "corral-plug"}
    with pytest.raises(ConfigError, match=r"provider\.tag: Field required"):
        Sandbox(provider="plug")
    assert "plug" in provider_names()


def test_the_config_is_in_the_key_but_the_defaults_keep_old_keys(plug: None) -> None:
    red = Sandbox(provider="plug", provider_config={"tag": "red"})
    blue = Sandbox(provider="plug", provider_config={"tag": "blue"})
    assert red.key(ctx()) != blue.key(ctx())
    assert red.key(ctx()) == Sandbox(provider="plug", provider_config={"tag": "red"}).key(ctx())
    # No configuration given: the canonical form has no config field (keys made before
    # configurations were keyed still match).
    plain = KeyInput("default", "local", "f", "w", False, None, "t", "r")
    assert "provider_config" not in plain.canonical()
    home = Sandbox(provider="local", provider_config={"home": "/tmp/elsewhere"})
    assert home.key(ctx()) != Sandbox(provider="local").key(ctx())


def test_round_trip_through_plain_data_keeps_provider_and_config(plug: None) -> None:
    sb = Sandbox(provider="plug", provider_config={"tag": "red"})
    again = Sandbox.from_dict(sb.to_dict())
    assert again.provider_config == {"tag": "red"} and again.key(ctx()) == sb.key(ctx())


@pytest.mark.anyio
async def test_instances_record_the_provider_and_gc_rebuilds_it(plug: None,
                                                                corral_home: Path) -> None:
    store = MemoryStore()
    sb = Sandbox(provider="plug", provider_config={"tag": "green"},
                 lifecycle=Lifecycle(keep_alive="1m"))
    ensured = await sb.ensure(ctx(), store=store)
    handle = ensured.handle
    assert isinstance(handle, HostPaths) and isinstance(handle, Described)
    assert handle.ref.provider == "plug"
    assert Path(handle.host_path(handle.workdir)).is_dir()
    assert ensured.record.meta["provider"] == {"name": "plug", "config": {"tag": "green"},
                                               "package": "corral-plug"}
    assert ensured.record.expires_at is not None
    report = await collect_idle(store, now=ensured.record.expires_at + 1)
    assert report.counts == {"destroyed": 1}
    assert (corral_home / "plug-destroyed.log").read_text() == f"green {handle.id}\n"
    assert await store.get_instance(ensured.key) is None


@pytest.mark.anyio
async def test_gc_of_a_record_whose_provider_is_missing_names_the_package() -> None:
    store = MemoryStore()
    meta: dict[str, Any] = {"provider": {"name": "ghost", "config": {"x": 1},
                                         "package": "corral-ghost"}}
    await store.upsert_instance(InstanceRecord("k", "ghost", "sb-1", "t", 0.0,
                                               expires_at=1.0, meta=meta))
    report = await collect_idle(store, now=2.0)
    (entry,) = report.entries
    assert entry.outcome == "unknown-provider"
    assert "install the package 'corral-ghost'" in entry.detail
    assert await store.get_instance("k") is not None  # nothing guessed


def test_a_factory_that_returns_no_provider_is_refused() -> None:
    class Config(ProviderConfig):
        pass

    register_provider("broken", lambda: object(), config=Config)  # type: ignore[arg-type,return-value]
    try:
        with pytest.raises(ConfigError, match="not a corral.abc.Provider"):
            get_provider("broken")
    finally:
        unregister_provider("broken")


def test_the_builtins_offer_their_capabilities(corral_home: Path) -> None:
    assert isinstance(LocalProvider(), ProvidesSnapshots)
    # what `corral sandboxes ls|rm|prune` ask of a provider, by protocol (never by probing
    # an attribute): host-directory sandboxes, and who prunes orphaned ones
    local, bwrap = get_provider("local"), get_provider("bubblewrap")
    assert isinstance(local, SandboxDirs) and isinstance(bwrap, SandboxDirs)
    assert isinstance(bwrap, PrunesOrphans) and not isinstance(local, PrunesOrphans)
    assert bwrap.base_dir.is_relative_to(corral_home)
    from corral.providers._docker import DockerProvider

    docker = DockerProvider()
    assert not isinstance(docker, SandboxDirs) and not isinstance(docker, PrunesOrphans)
    assert BubblewrapProvider.config_model.model_fields.keys() == {"home", "limits",
                                                                  "host_uid", "bwrap", "agent"}
