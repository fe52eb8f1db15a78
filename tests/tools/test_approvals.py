"""Approvals for "ask" host tools: the call waits, allow/deny/timeout, forged ids; the
requests, answers and corral's key live in the store, so another host answers."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from ag_ui.core import BaseEvent, CustomEvent
from hypothesis import given
from hypothesis import strategies as st

from corral.harness._events import event_to_dict
from corral.runs._host_tools import append_aside
from corral.stores import open_store
from corral.stores._protocols import NewRun, Store
from corral.tools import Toolset, tool
from corral.tools._approvals import (
    APPROVAL_REQUEST_EVENT,
    APPROVAL_RESOLVED_EVENT,
    ApprovalError,
    Approvals,
    ApprovalSigner,
    answer_approval,
    list_pending,
)
from corral.tools._keys import SECRET_ENV, derive_token
from corral.tools._mcp_server import HostToolServer
from corral.tools._projection import run_tools_token
from corral.testing import wait_until_async
from tests.helpers import assert_secret_only_in_secrets_table, one_line_refusal

from .mcp_client import mcp_client

pytestmark = pytest.mark.anyio
SRC = Path(__file__).resolve().parents[2] / "src"

ran: list[dict[str, Any]] = []


@pytest.fixture(autouse=True)
def no_corral_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's key unless a test sets ``CORRAL_SECRET`` (before ``cli_env`` copies the
    environment)."""
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.delenv("CORRAL_STORE", raising=False)


@pytest.fixture
def approve_cmd(corral_cmd: list[str]) -> list[str]:
    return [*corral_cmd, "approve"]


@pytest.fixture
async def store(corral_home: Path) -> AsyncIterator[Store]:
    """The store ``corral approve`` opens by default (``$CORRAL_HOME/corral.db``)."""
    s = await open_store(f"sqlite://{corral_home / 'corral.db'}")
    yield s
    await s.aclose()


def host_env(home: Path, **more: str) -> dict[str, str]:
    """The environment of a process on another host: its own ``$CORRAL_HOME``."""
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in (SECRET_ENV, "CORRAL_STORE")}
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env["CORRAL_HOME"] = str(home)
    env.update(more)
    return env


@tool(approval=True)
def deploy(env: str) -> str:
    """Deploy (asks a human first)."""
    ran.append({"env": env})
    return f"deployed to {env}"


def requests_in(events: list[BaseEvent]) -> list[CustomEvent]:
    return [e for e in events if isinstance(e, CustomEvent) and e.name == APPROVAL_REQUEST_EVENT]


async def request_event(events: list[BaseEvent]) -> CustomEvent:
    await wait_until_async(lambda: requests_in(events), "the approval request event",
                           timeout=20, interval=0.02)
    return requests_in(events)[0]


class Run:
    def __init__(self, srv: HostToolServer, sock: str, events: list[BaseEvent]) -> None:
        self.srv, self.sock, self.events = srv, sock, events

    async def request_event(self) -> CustomEvent:
        return await request_event(self.events)


@pytest.fixture
async def run(tmp_path: Path, store: Store) -> AsyncIterator[Run]:
    ran.clear()
    events: list[BaseEvent] = []
    gate = Approvals(store, "run-7", emit=events.append, timeout=20)
    srv = HostToolServer(Toolset([deploy]), run_id="run-7", approvals=gate, call_timeout=5)
    sock = tmp_path / "tools.sock"
    async with anyio.create_task_group() as tg:
        await tg.start(srv.serve, sock)
        yield Run(srv, str(sock), events)
        tg.cancel_scope.cancel()


async def test_call_waits_then_allowed_from_the_cli(
        run: Run, store: Store, approve_cmd: list[str], cli_env: dict[str, str]) -> None:
    result: list[Any] = []

    async def call() -> None:
        async with mcp_client(run.sock, run.srv.token) as c:
            result.append(await c.call_tool("deploy", {"env": "staging"}))

    with anyio.fail_after(40):
        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            ev = await run.request_event()
            # toolCallId: the call's id (the agent's own when its CLI names it), which
            # the AG-UI endpoint's interrupt carries
            assert set(ev.value) == {"approvalId", "runId", "tool", "args", "expiresAt",
                                     "toolCallId"}
            assert ev.value["tool"] == "deploy" and ev.value["args"] == {"env": "staging"}
            assert ev.value["runId"] == "run-7"
            approval_id = ev.value["approvalId"]
            assert ran == [] and result == []  # held while nobody answered
            [pending] = await list_pending(store, "run-7")
            assert pending.approval_id == approval_id and pending.tool == "deploy"
            assert pending.expires_at == ev.value["expiresAt"]
            listed = await anyio.run_process([*approve_cmd, "run-7", "--list",
                                              "--json"], env=cli_env)
            assert json.loads(listed.stdout) == [{  # one answer: one document
                "approval_id": approval_id, "run_id": "run-7", "tool": "deploy",
                "args": {"env": "staging"}, "created_at": pending.created_at,
                "expires_at": ev.value["expiresAt"]}]
            out = await anyio.run_process([*approve_cmd, "run-7", approval_id,
                                           "--allow"], env=cli_env)
            assert out.stdout.decode().strip() == f"allowed {approval_id}"
    [r] = result
    assert not r.is_error and r.content[0].text == "deployed to staging"
    assert ran == [{"env": "staging"}]
    resolved = [e for e in run.events if isinstance(e, CustomEvent)
                and e.name == APPROVAL_RESOLVED_EVENT]
    assert [e.value for e in resolved] == [
        {"approvalId": approval_id, "decision": "allow", "reason": None}]
    with pytest.raises(ApprovalError, match="already answered: allow"):
        await answer_approval(store, "run-7", approval_id, False)
    assert await list_pending(store, "run-7") == []


async def test_denied_call_returns_the_denial(run: Run, store: Store) -> None:
    result: list[Any] = []

    async def call() -> None:
        async with mcp_client(run.sock, run.srv.token) as c:
            result.append(await c.call_tool("deploy", {"env": "prod"}))

    with anyio.fail_after(40):
        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            ev = await run.request_event()
            await answer_approval(store, "run-7", ev.value["approvalId"], False,
                                  reason="not on Friday")
    [r] = result
    assert r.is_error
    assert "denied by a human: not on Friday" in r.content[0].text
    assert ran == [] and await list_pending(store, "run-7") == []


async def test_timeout_denies(store: Store) -> None:
    ran.clear()
    events: list[BaseEvent] = []
    gate = Approvals(store, "run-t", emit=events.append, timeout=0.3)
    with anyio.fail_after(10):
        reason = await gate.request("deploy", {"env": "x"})
    assert reason == "no answer within 0.3s"
    assert [e.name for e in events if isinstance(e, CustomEvent)] == [
        APPROVAL_REQUEST_EVENT, APPROVAL_RESOLVED_EVENT]
    approval_id = events[0].value["approvalId"]  # type: ignore[attr-defined]
    assert events[1].value == {"approvalId": approval_id,  # type: ignore[attr-defined]
                               "decision": "timeout", "reason": "no answer within 0.3s"}
    with pytest.raises(ApprovalError, match="already answered: timeout"):
        await answer_approval(store, "run-t", approval_id, True)


async def test_a_cancelled_call_leaves_nothing_pending(store: Store) -> None:
    """The agent hung up (or the driver stopped) while a human had not answered: the
    request leaves the pending list, and a late answer is refused."""
    events: list[BaseEvent] = []
    gate = Approvals(store, "run-c", emit=events.append, timeout=60)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(gate.request, "deploy", {})
            approval_id = (await request_event(events)).value["approvalId"]
            assert [a.approval_id for a in await list_pending(store, "run-c")] == [approval_id]
            tg.cancel_scope.cancel()
    assert await list_pending(store, "run-c") == []
    got = await store.get_approval("run-c", approval_id)
    assert got is not None and got[1] is not None
    assert (got[1].decision, got[1].reason) == ("timeout", "the tool call ended before an answer")
    with pytest.raises(ApprovalError, match="already answered: timeout"):
        await answer_approval(store, "run-c", approval_id, True)
    assert len(events) == 1  # no resolved event: nobody waits for one


async def test_forged_or_foreign_ids_are_refused(
        store: Store, approve_cmd: list[str], cli_env: dict[str, str]) -> None:
    events: list[BaseEvent] = []
    gate = Approvals(store, "run-a", emit=events.append, timeout=20)
    decisions: list[str | None] = []

    async def ask() -> None:
        decisions.append(await gate.request("deploy", {}))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)
            real = (await request_event(events)).value["approvalId"]
            nonce, mac = real.split(".")
            forged = f"{nonce}.{'A' * len(mac)}"
            with pytest.raises(ApprovalError, match="not valid for run 'run-a'"):
                await answer_approval(store, "run-a", forged, True)
            with pytest.raises(ApprovalError, match="not valid"):
                await answer_approval(store, "run-a", "whatever", True)
            other = (await ApprovalSigner.for_store(store)).new_id("run-b")
            with pytest.raises(ApprovalError, match="not valid for run 'run-a'"):
                await answer_approval(store, "run-a", other, True)  # minted for another run
            with pytest.raises(ApprovalError, match="not valid for run 'run-b'"):
                await answer_approval(store, "run-b", real, True)  # replayed elsewhere
            # a key other than corral's cannot mint ids it accepts
            alien = ApprovalSigner(b"x" * 32).new_id("run-a")
            with pytest.raises(ApprovalError, match="not valid"):
                await answer_approval(store, "run-a", alien, True)
            unknown = (await ApprovalSigner.for_store(store)).new_id("run-a")
            with pytest.raises(ApprovalError, match="no pending approval"):
                await answer_approval(store, "run-a", unknown, True)  # signed, never asked
            cli = await anyio.run_process([*approve_cmd, "run-a", forged, "--allow"],
                                          env=cli_env, check=False)
            assert cli.returncode == 2
            assert b"not valid for run" in cli.stderr and b"Traceback" not in cli.stderr
            assert decisions == []  # still waiting: nothing forged got through
            await answer_approval(store, "run-a", real, False)
    assert decisions == ["denied by a human"]


# ------------------------------------------------------------------ another host


async def test_another_home_sharing_the_store_answers(
        tmp_path: Path, corral_home: Path, corral_cmd: list[str]) -> None:
    """The multi-host property: the run's store is a SQLite file; ``corral approve`` runs
    with a different ``$CORRAL_HOME`` and the store's URL (``--store``, then
    ``CORRAL_STORE``), lists the request and answers it."""
    (tmp_path / "shared").mkdir()
    url = f"sqlite://{tmp_path / 'shared' / 'corral.db'}"
    store = await open_store(url)
    events: list[BaseEvent] = []
    gate = Approvals(store, "run-mh", emit=events.append, timeout=30)
    decisions: list[str | None] = []
    other_host = host_env(tmp_path / "host-b")
    by_env = host_env(tmp_path / "host-c", CORRAL_STORE=url)

    async def ask(args: dict[str, str]) -> None:
        decisions.append(await gate.request("deploy", args))

    try:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(ask, {"env": "prod"})
                approval_id = (await request_event(events)).value["approvalId"]
                listed = await anyio.run_process(
                    [*corral_cmd, "approve", "run-mh", "--list", "--json", "--store", url],
                    env=other_host)
                # the HTTP API's spelling (GET /v1/runs/{id}/approvals), not the event's
                [pending] = json.loads(listed.stdout)  # one document: an array
                assert set(pending) == {
                    "approval_id", "run_id", "tool", "args", "created_at", "expires_at"}
                assert pending["approval_id"] == approval_id
                out = await anyio.run_process(
                    [*corral_cmd, "approve", "run-mh", approval_id, "--allow", "--store",
                     url], env=other_host)
                assert out.stdout.decode().strip() == f"allowed {approval_id}"
            assert decisions == [None]  # allowed
            events.clear()
            async with anyio.create_task_group() as tg:
                tg.start_soon(ask, {"env": "dev"})
                approval_id = (await request_event(events)).value["approvalId"]
                out = await anyio.run_process(
                    [*corral_cmd, "approve", "run-mh", approval_id, "--deny", "--reason",
                     "not now"], env=by_env)
                assert out.stdout.decode().strip() == f"denied {approval_id}"
            assert decisions == [None, "denied by a human: not now"]
    finally:
        await store.aclose()
    # no host kept anything of it in its own home
    for home in (corral_home, tmp_path / "host-b", tmp_path / "host-c"):
        assert not (home / "approvals").exists()


async def test_forged_and_foreign_ids_from_another_host_are_refused_in_one_line(
        tmp_path: Path, corral_cmd: list[str]) -> None:
    url = f"sqlite://{tmp_path / 'corral.db'}"
    store = await open_store(url)
    events: list[BaseEvent] = []
    gate = Approvals(store, "run-a", emit=events.append, timeout=30)
    other_host = host_env(tmp_path / "host-b")
    decisions: list[str | None] = []

    async def ask() -> None:
        decisions.append(await gate.request("deploy", {}))

    def approve(run_id: str, approval_id: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*corral_cmd, "approve", run_id, approval_id, "--allow",
                               "--store", url], env=other_host, capture_output=True,
                              text=True, timeout=60)

    try:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(ask)
                real = (await request_event(events)).value["approvalId"]
                nonce, mac = real.split(".")
                forged = await anyio.to_thread.run_sync(
                    approve, "run-a", f"{nonce}.{'A' * len(mac)}")
                one_line_refusal(forged, "not valid for run 'run-a'")
                foreign = (await ApprovalSigner.for_store(store)).new_id("run-b")
                one_line_refusal(await anyio.to_thread.run_sync(approve, "run-a", foreign),
                                 "not valid for run 'run-a'")
                replayed = await anyio.to_thread.run_sync(approve, "run-b", real)
                one_line_refusal(replayed, "not valid for run 'run-b'")
                assert decisions == []  # still held
                ok = await anyio.to_thread.run_sync(approve, "run-a", real)
                assert ok.returncode == 0, ok.stderr
            again = await anyio.to_thread.run_sync(approve, "run-a", real)
            one_line_refusal(again, "already answered: allow")
    finally:
        await store.aclose()
    assert decisions == [None]


TOKEN_PRINTER = textwrap.dedent(
    """
    import sys, anyio
    from corral.stores import open_store
    from corral.tools import run_tools_token

    async def main(url, run_id):
        store = await open_store(url)
        print(await run_tools_token(store, run_id), flush=True)
        await store.aclose()

    anyio.run(main, sys.argv[1], sys.argv[2])
    """
)


async def test_tool_tokens_agree_across_homes_sharing_the_store(tmp_path: Path) -> None:
    """A successor on another host serves the run's tools with the token the agent has."""
    url = f"sqlite://{tmp_path / 'corral.db'}"
    tokens: dict[str, str] = {}

    async def host(name: str) -> None:
        out = await anyio.run_process([sys.executable, "-c", TOKEN_PRINTER, url, "run-x"],
                                      env=host_env(tmp_path / name))
        tokens[name] = out.stdout.decode().strip()

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:  # both make the store's key at once
            for name in ("host-a", "host-b", "host-c"):
                tg.start_soon(host, name)
    assert len(set(tokens.values())) == 1 and len(tokens["host-a"]) >= 43
    store = await open_store(url)
    try:
        assert await run_tools_token(store, "run-x") == tokens["host-a"]
        assert await run_tools_token(store, "run-y") != tokens["host-a"]
    finally:
        await store.aclose()
    other = await open_store(f"sqlite://{tmp_path / 'other.db'}")  # another store's key
    try:
        assert await run_tools_token(other, "run-x") != tokens["host-a"]
    finally:
        await other.aclose()


async def test_corral_secret_overrides_the_store_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, corral_cmd: list[str]) -> None:
    a_url, b_url = f"sqlite://{tmp_path / 'a.db'}", f"sqlite://{tmp_path / 'b.db'}"
    a, b = await open_store(a_url), await open_store(b_url)
    c = await open_store(f"sqlite://{tmp_path / 'c.db'}")
    try:
        store_token = await run_tools_token(a, "run-s")
        assert store_token != await run_tools_token(c, "run-s")  # each store has its key
        secret = "s3cr3t-" * 6
        monkeypatch.setenv(SECRET_ENV, secret)
        expected = derive_token(hashlib.sha256(secret.encode()).digest(),
                                "corral-tools-token", "run-s")
        assert await run_tools_token(a, "run-s") == expected != store_token
        assert await run_tools_token(b, "run-s") == expected  # the stores' keys unused
        # an id minted under CORRAL_SECRET is answered where it is set, refused elsewhere
        events: list[BaseEvent] = []
        gate = Approvals(b, "run-s", emit=events.append, timeout=30)
        decisions: list[str | None] = []

        async def ask() -> None:
            decisions.append(await gate.request("deploy", {}))

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(ask)
                approval_id = (await request_event(events)).value["approvalId"]
                # with CORRAL_SECRET set, corral's key was never put in the store
                assert secret_names(tmp_path / "b.db") == []
                argv = [*corral_cmd, "approve", "run-s", approval_id, "--allow", "--store",
                        b_url]
                without = await anyio.run_process(argv, env=host_env(tmp_path / "h1"),
                                                  check=False)
                one_line_refusal(_text(without), "not valid for run 'run-s'")
                short = await anyio.run_process(
                    argv, env=host_env(tmp_path / "h2", CORRAL_SECRET="too short"),
                    check=False)
                one_line_refusal(_text(short), "CORRAL_SECRET is 9 characters long",
                                 "at least 32")
                ok = await anyio.run_process(
                    argv, env=host_env(tmp_path / "h3", CORRAL_SECRET=secret))
                assert ok.stdout.decode().strip() == f"allowed {approval_id}"
        assert decisions == [None]
    finally:
        for s in (a, b, c):
            await s.aclose()


def secret_names(db: Path) -> list[str]:
    raw = sqlite3.connect(db)
    try:
        return [n for (n,) in raw.execute("SELECT name FROM secrets")]
    finally:
        raw.close()


def _text(proc: subprocess.CompletedProcess[bytes]) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(),
                                       proc.stderr.decode())


async def test_the_key_is_in_no_event_log_or_record(
        tmp_path: Path, corral_home: Path, store: Store, approve_cmd: list[str],
        cli_env: dict[str, str], caplog: pytest.LogCaptureFixture) -> None:
    """A run's approvals, as its driver logs them, and the answers: the store's key shows
    up in its own table and nowhere else (events, run record, approvals, logs, output)."""
    caplog.set_level(logging.DEBUG)
    await store.create(NewRun("run-k", "t"))
    epoch = (await store.acquire_claim("run-k", "me", 60)).epoch

    async def emit(event: BaseEvent) -> None:  # as the driver logs them
        await append_aside(store, "run-k", [event_to_dict(event)], epoch)

    gate = Approvals(store, "run-k", emit=emit, timeout=30)
    token = await run_tools_token(store, "run-k")
    outputs: list[str] = []
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(gate.request, "deploy", {"env": "prod"})

            async def logged() -> list[dict[str, Any]]:
                return [e.event for e in await store.snapshot("run-k")]

            await wait_until_async(logged, "the request in the log", timeout=20)
            approval_id = (await logged())[0]["value"]["approvalId"]
            listed = await anyio.run_process([*approve_cmd, "run-k", "--list"], env=cli_env)
            out = await anyio.run_process([*approve_cmd, "run-k", approval_id, "--allow"],
                                          env=cli_env)
            outputs += [listed.stdout.decode(), listed.stderr.decode(), out.stdout.decode(),
                        out.stderr.decode()]
    await Approvals(store, "run-k", emit=emit, timeout=0.2).request("deploy", {})  # timeout
    names = [e.event.get("name") for e in await store.snapshot("run-k")]
    assert names == [APPROVAL_REQUEST_EVENT, APPROVAL_RESOLVED_EVENT] * 2
    key = await store.shared_secret("approvals")
    assert_secret_only_in_secrets_table(corral_home / "corral.db", key, caplog.text, *outputs)
    record = await store.get("run-k")
    assert record is not None and token not in json.dumps(record.to_dict())


# ------------------------------------------------------------------ ids


@given(st.text(min_size=1, max_size=20), st.text(min_size=1, max_size=20),
       st.integers(min_value=0, max_value=60), st.characters(codec="ascii"))
def test_signer_properties(run_a: str, run_b: str, pos: int, ch: str) -> None:
    s = ApprovalSigner(b"k" * 32)
    aid = s.new_id(run_a)
    assert s.verify(run_a, aid)
    assert s.verify(run_b, aid) == (run_a == run_b)
    i = pos % len(aid)
    tampered = aid[:i] + ch + aid[i + 1:]
    assert s.verify(run_a, tampered) == (tampered == aid)
    assert not ApprovalSigner(b"j" * 32).verify(run_a, aid)  # another key's ids


def test_ids_never_look_like_options() -> None:
    """An id is passed to ``corral approve`` on the command line: one starting with '-'
    would be read as an option (base64url nonces start with '-' one time in 64)."""
    s = ApprovalSigner(b"k" * 32)
    ids = [s.new_id("run") for _ in range(2000)]
    assert not any(i.startswith("-") for i in ids)
    assert all(s.verify("run", i) for i in ids[:50])


async def test_the_same_call_asked_again_finds_its_first_request_and_answer(
        store: Store) -> None:
    """A driver stops (detach, shutdown) while a call waits; the answer lands with no
    driver; the durable caller (the ACP bridge) asks the successor's gate the same
    question: it gets that answer, and no second request is announced. Another call (id or
    arguments) is a new question."""
    first: list[BaseEvent] = []
    dead = Approvals(store, "run-9", emit=first.append, timeout=20)
    async with anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(dead.request, "Bash", {"command": "echo hi"},
                                        call_id="c1"))
        req = await request_event(first)
        tg.cancel_scope.cancel()  # the driver stops: the question still stands
    approval_id = req.value["approvalId"]
    assert [a.approval_id for a in await list_pending(store, "run-9")] == [approval_id]
    await answer_approval(store, "run-9", approval_id, True)  # nobody drives
    again: list[BaseEvent] = []
    succ = Approvals(store, "run-9", emit=again.append, timeout=20)
    assert await succ.request("Bash", {"command": "echo hi"}, call_id="c1") is None
    assert requests_in(again) == []  # announced once, by the first driver
    resolved = [e for e in again if isinstance(e, CustomEvent)
                and e.name == APPROVAL_RESOLVED_EVENT]
    assert [(e.value["approvalId"], e.value["decision"]) for e in resolved] == [
        (approval_id, "allow")]
    # pending, then answered by a human while nobody drives
    signer = await ApprovalSigner.for_store(store)
    other = signer.id_for_call("run-9", "c2", "Bash", {"command": "echo hi"})
    assert other != approval_id
    assert signer.verify("run-9", other) and not signer.verify("run-8", other)
    assert signer.id_for_call("run-9", "c1", "Bash", {"command": "echo ho"}) != approval_id
    later: list[BaseEvent] = []
    gate = Approvals(store, "run-9", emit=later.append, timeout=20)
    async with anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(gate.request, "Bash", {"command": "echo hi"},
                                        call_id="c2"))
        req2 = await request_event(later)
        assert req2.value["approvalId"] == other
        await answer_approval(store, "run-9", other, True)
    assert [e.value["decision"] for e in later if isinstance(e, CustomEvent)
            and e.name == APPROVAL_RESOLVED_EVENT] == ["allow"]
    assert await Approvals(store, "run-9", timeout=20).request(
        "Bash", {"command": "echo hi"}, call_id="c2") is None


async def test_a_called_request_nobody_asks_again_expires(store: Store) -> None:
    """The caller of a call with an id never came back: past its expiry the request leaves
    the pending list, and an answer is refused in one line (recorded as a timeout)."""
    events: list[BaseEvent] = []
    gate = Approvals(store, "run-x", emit=events.append, timeout=0.5)
    async with anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(gate.request, "Bash", {"command": "ls"},
                                        call_id="c1"))
        approval_id = (await request_event(events)).value["approvalId"]
        tg.cancel_scope.cancel()
    assert [a.approval_id for a in await list_pending(store, "run-x")] == [approval_id]
    await wait_until_async(
        lambda: _no_pending(store, "run-x"), "the request to expire", timeout=10)
    with pytest.raises(ApprovalError, match="expired") as err:
        await answer_approval(store, "run-x", approval_id, True)
    assert "\n" not in str(err.value)
    got = await store.get_approval("run-x", approval_id)
    assert got is not None and got[1] is not None and got[1].decision == "timeout"


async def _no_pending(store: Store, run_id: str) -> bool:
    return await list_pending(store, run_id) == []
