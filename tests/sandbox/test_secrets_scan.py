"""Secrets reach processes as env; no byte corral writes holds a value."""

from __future__ import annotations

import logging
import secrets as pysecrets
from pathlib import Path

import pytest

from corral import Lifecycle, RunContext, Sandbox, Secrets, Workspace
from corral.providers._snapshots import SecretInSnapshotError
from corral.stores._protocols import Store
from corral.sandbox._setup_shell import SetupError
from corral.testing._leaks import assert_no_secrets, find_secrets

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("bwrap_ok")]


def fresh_values() -> dict[str, str]:
    return {"API_TOKEN": "tok-" + pysecrets.token_hex(16), "DB_PASSWORD": pysecrets.token_urlsafe(24)}


def test_scanner_finds_planted_values(tmp_path: Path) -> None:
    values = fresh_values()
    (tmp_path / "deep" / "er").mkdir(parents=True)
    (tmp_path / "deep" / "er" / "f.bin").write_bytes(b"\x00" * 5000 + values["API_TOKEN"].encode())
    hits = find_secrets([tmp_path], values)
    assert [(Path(h.path).name, h.secret) for h in hits] == [("f.bin", "API_TOKEN")]
    with pytest.raises(AssertionError, match="API_TOKEN"):
        assert_no_secrets([tmp_path], values)


async def test_secret_env_reaches_processes_and_nothing_on_disk(
    store: Store, corral_home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    values = fresh_values()
    sb = Sandbox(
        provider="bubblewrap",
        workspace=Workspace(
            secrets=Secrets(values),
            setup=[
                'test -n "$API_TOKEN" && echo "token is $API_TOKEN"',
                "export DERIVED=\"x$DB_PASSWORD\"",
                'test "$DERIVED" = "x$DB_PASSWORD"',
            ],
        ),
        lifecycle=Lifecycle(snapshot="after-setup"),
    )
    ctx = RunContext("t1", "r1")
    caplog.set_level(logging.DEBUG, logger="corral")
    ensured = await sb.ensure(ctx, store=store)
    try:
        h = ensured.handle
        echo = await h.process.exec(["sh", "-c", 'echo "$API_TOKEN|$DB_PASSWORD"'], env=ensured.exec_env())
        assert echo.stdout.decode().strip() == f"{values['API_TOKEN']}|{values['DB_PASSWORD']}"
        without = await h.process.exec(["sh", "-c", 'echo "[$API_TOKEN]"'])
        assert without.stdout.decode().strip() == "[]"  # nothing baked into the sandbox
        files_dir = Path(h.host_root).parent  # workspace, home, tmp, generated etc/
        assert_no_secrets([corral_home, files_dir], values)
        assert not any(v in caplog.text for v in values.values())
        assert ensured.redactor.redact(echo.stdout.decode()) == "[REDACTED:API_TOKEN]|[REDACTED:DB_PASSWORD]\n"
        assert values["API_TOKEN"] not in repr(ensured)
    finally:
        await sb.destroy(ctx, store=store)


async def test_failing_setup_error_is_redacted(store: Store) -> None:
    values = fresh_values()
    sb = Sandbox(
        provider="local",
        workspace=Workspace(secrets=Secrets(values), setup=['echo "leaking $API_TOKEN"; exit 1']),
    )
    with pytest.raises(SetupError) as err:
        await sb.ensure(RunContext("t", "r"), store=store)
    assert values["API_TOKEN"] not in str(err.value)
    assert "leaking [REDACTED:API_TOKEN]" in str(err.value)


async def test_snapshot_refuses_a_secret_written_to_a_file(store: Store, corral_home: Path) -> None:
    values = fresh_values()
    sb = Sandbox(
        provider="bubblewrap",
        workspace=Workspace(secrets=Secrets(values), setup=['echo "$DB_PASSWORD" > /home/agent/.pgpass']),
        lifecycle=Lifecycle(snapshot="after-setup"),
    )
    before = await sb.get_provider().list()
    with pytest.raises(SecretInSnapshotError, match="DB_PASSWORD.*home/agent/.pgpass"):
        await sb.ensure(RunContext("t", "r"), store=store)
    assert await sb.get_provider().list() == before
    assert await store.get_instance(sb.key(RunContext("t", "r"))) is None
    assert_no_secrets([corral_home], values)
