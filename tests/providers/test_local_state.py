"""The local provider's state: kept whole in one attribute of the sandbox directory (or in
``state.json`` where the filesystem has no user attributes), never taken for a sandbox when
it is not there whole (issue #17's one-syscall create keeps create's crash safety)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from corral._errors import ConfigError
from corral.providers import _state
from corral.providers._local import LocalProvider
from corral.sandbox._contracts import SandboxGoneError
from corral.sandbox._copyguard import StateGuard
from corral.sandbox import _copyguard

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("corral_home")]


def _xattrs_here(path: Path) -> bool:
    try:
        os.setxattr(path, "user.corral.probe", b"1")
    except OSError:
        return False
    os.removexattr(path, "user.corral.probe")
    return True


@pytest.fixture
def provider() -> LocalProvider:
    p = LocalProvider()
    if not _xattrs_here(p.base_dir):
        pytest.skip("the filesystem under CORRAL_HOME keeps no user attributes")
    return p


async def test_create_writes_the_state_as_one_attribute(provider: LocalProvider) -> None:
    h = await provider.create()
    where = h.state_dir
    assert os.listdir(where) == []
    stored = json.loads(os.getxattr(where, _state.STATE_XATTR))
    assert stored["id"] == h.id and stored["token"] == h.state.token
    again = await LocalProvider().resume(h.id)
    assert again is not None and again.state == h.state
    assert [r.id for r in await provider.list()] == [h.id]
    await provider.destroy(h.ref)
    assert not os.path.exists(where) and await provider.list() == []


async def test_without_attributes_the_state_is_a_file(provider: LocalProvider,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    def no_xattrs(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOTSUP, "Operation not supported")

    with monkeypatch.context() as patch:
        patch.setattr(os, "setxattr", no_xattrs)
        h = await provider.create()
    assert os.listdir(h.state_dir) == ["state.json"]
    again = await LocalProvider().resume(h.id)
    assert again is not None and again.state == h.state
    assert (await again.process.exec("true")).ok
    assert [r.id for r in await provider.list()] == [h.id]
    await provider.destroy(h.ref)
    assert not os.path.exists(h.state_dir)


async def test_a_directory_whose_create_died_is_no_sandbox(provider: LocalProvider) -> None:
    # create died between its mkdir and its setxattr
    (provider.base_dir / "sb-half").mkdir(mode=0o700)
    assert await provider.resume("sb-half") is None
    assert await provider.list() == []
    await provider.destroy("sb-half")
    assert not (provider.base_dir / "sb-half").exists()


@pytest.mark.parametrize("where", ["attribute", "file"])
async def test_a_torn_state_is_never_taken_for_a_sandbox(provider: LocalProvider,
                                                         where: str) -> None:
    h = await provider.create()
    whole = os.getxattr(h.state_dir, _state.STATE_XATTR)
    os.removexattr(h.state_dir, _state.STATE_XATTR)
    cuts = sorted({0, 1, 2, len(whole) // 3, len(whole) // 2, len(whole) - 2, len(whole) - 1})
    for cut in cuts:
        part = whole[:cut]
        if where == "attribute":
            if not part:
                continue  # an empty attribute cannot be told from none; setxattr is whole
            os.setxattr(h.state_dir, _state.STATE_XATTR, part)
        else:
            Path(h.state_dir, "state.json").write_bytes(part)
        with pytest.raises(ConfigError, match="unreadable"):
            await LocalProvider().resume(h.id)
    # and a file filled with zeros (a power loss before the data reached the disk)
    if where == "file":
        Path(h.state_dir, "state.json").write_bytes(b"\0" * len(whole))
        with pytest.raises(ConfigError, match="unreadable"):
            await LocalProvider().resume(h.id)


async def test_an_interrupted_destroy_is_refused_then_finished(provider: LocalProvider) -> None:
    h = await provider.create()
    _state.mark_destroying(h.state_dir)  # the destroy died right after marking it
    assert os.listdir(h.state_dir) == ["state.destroying.json"]
    assert await LocalProvider().resume(h.id) is None
    with pytest.raises(SandboxGoneError):
        await h.process.exec("true")
    await provider.destroy(h.ref)
    assert not os.path.exists(h.state_dir)


async def test_a_destroy_that_died_while_marking_starts_over(provider: LocalProvider) -> None:
    h = await provider.create()
    blob = os.getxattr(h.state_dir, _state.STATE_XATTR)
    # died after writing state.destroying.json, before removing the attribute
    Path(h.state_dir, "state.destroying.json").write_bytes(blob)
    again = await LocalProvider().resume(h.id)
    assert again is not None and not again.state.destroying
    await provider.destroy(h.ref)
    assert not os.path.exists(h.state_dir)


async def test_a_local_sandbox_dir_with_its_state_attribute_is_not_copied(
        provider: LocalProvider) -> None:
    assert _copyguard._STATE_XATTR == _state.STATE_XATTR
    h = await provider.create()
    assert (await h.process.exec("true")).ok  # makes root/
    guard = StateGuard(roots=(), store=None)
    names = os.listdir(h.state_dir)
    assert "state.json" not in names
    assert guard.skip_dir(h.state_dir, names) is not None
    plain = provider.base_dir.parent / "project"
    (plain / "root").mkdir(parents=True)
    assert guard.skip_dir(str(plain), os.listdir(plain)) is None
    await provider.destroy(h.ref)
