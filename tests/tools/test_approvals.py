"""Approvals for "ask" host tools: the call waits, allow/deny/timeout, forged ids."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from ag_ui.core import BaseEvent, CustomEvent
from hypothesis import given
from hypothesis import strategies as st

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
from corral.tools._mcp_server import HostToolServer
from corral.testing import wait_until_async

from .mcp_client import mcp_client

pytestmark = pytest.mark.anyio

ran: list[dict[str, Any]] = []

@pytest.fixture
def approve_cmd(corral_cmd: list[str]) -> list[str]:
    return [*corral_cmd, "approve"]


@tool(approval=True)
def deploy(env: str) -> str:
    """Deploy (asks a human first)."""
    ran.append({"env": env})
    return f"deployed to {env}"


class Run:
    def __init__(self, srv: HostToolServer, sock: str, events: list[BaseEvent]) -> None:
        self.srv, self.sock, self.events = srv, sock, events

    async def request_event(self) -> CustomEvent:
        def requests() -> list[CustomEvent]:
            return [e for e in self.events
                    if isinstance(e, CustomEvent) and e.name == APPROVAL_REQUEST_EVENT]

        await wait_until_async(requests, "the approval request event", timeout=20,
                               interval=0.02)
        return requests()[0]


@pytest.fixture
async def run(tmp_path: Path, corral_home: Path) -> AsyncIterator[Run]:
    ran.clear()
    events: list[BaseEvent] = []
    gate = Approvals("run-7", emit=events.append, timeout=20)
    srv = HostToolServer(Toolset([deploy]), run_id="run-7", approvals=gate, call_timeout=5)
    sock = tmp_path / "tools.sock"
    async with anyio.create_task_group() as tg:
        await tg.start(srv.serve, sock)
        yield Run(srv, str(sock), events)
        tg.cancel_scope.cancel()


async def test_call_waits_then_allowed_from_the_cli(
        run: Run, approve_cmd: list[str], cli_env: dict[str, str]) -> None:
    result: list[Any] = []

    async def call() -> None:
        async with mcp_client(run.sock, run.srv.token) as c:
            result.append(await c.call_tool("deploy", {"env": "staging"}))

    with anyio.fail_after(40):
        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            ev = await run.request_event()
            assert ev.value["tool"] == "deploy" and ev.value["args"] == {"env": "staging"}
            assert ev.value["runId"] == "run-7"
            approval_id = ev.value["approvalId"]
            assert ran == [] and result == []  # held while nobody answered
            [pending] = list_pending("run-7")
            assert pending.approval_id == approval_id and pending.tool == "deploy"
            listed = await anyio.run_process([*approve_cmd, "run-7", "--list",
                                              "--json"], env=cli_env)
            assert json.loads(listed.stdout)["approvalId"] == approval_id
            out = await anyio.run_process([*approve_cmd, "run-7", approval_id,
                                           "--allow"], env=cli_env)
            assert out.stdout.decode().strip() == f"allowed {approval_id}"
    [r] = result
    assert not r.is_error and r.content[0].text == "deployed to staging"
    assert ran == [{"env": "staging"}]
    resolved = [e for e in run.events if isinstance(e, CustomEvent)
                and e.name == APPROVAL_RESOLVED_EVENT]
    assert [e.value["decision"] for e in resolved] == ["allow"]
    with pytest.raises(ApprovalError, match="already answered: allow"):
        answer_approval("run-7", approval_id, False)


async def test_denied_call_returns_the_denial(run: Run) -> None:
    result: list[Any] = []

    async def call() -> None:
        async with mcp_client(run.sock, run.srv.token) as c:
            result.append(await c.call_tool("deploy", {"env": "prod"}))

    with anyio.fail_after(40):
        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            ev = await run.request_event()
            answer_approval("run-7", ev.value["approvalId"], False, reason="not on Friday")
    [r] = result
    assert r.is_error
    assert "denied by a human: not on Friday" in r.content[0].text
    assert ran == [] and list_pending("run-7") == []


async def test_timeout_denies(corral_home: Path) -> None:
    ran.clear()
    events: list[BaseEvent] = []
    gate = Approvals("run-t", emit=events.append, timeout=0.3)
    with anyio.fail_after(10):
        reason = await gate.request("deploy", {"env": "x"})
    assert reason == "no answer within 0.3s"
    assert [e.name for e in events if isinstance(e, CustomEvent)] == [
        APPROVAL_REQUEST_EVENT, APPROVAL_RESOLVED_EVENT]
    approval_id = events[0].value["approvalId"]  # type: ignore[attr-defined]
    with pytest.raises(ApprovalError, match="already answered: timeout"):
        answer_approval("run-t", approval_id, True)


async def test_forged_or_foreign_ids_are_refused(
        corral_home: Path, approve_cmd: list[str], cli_env: dict[str, str]) -> None:
    events: list[BaseEvent] = []
    gate = Approvals("run-a", emit=events.append, timeout=20)
    decisions: list[str | None] = []

    async def ask() -> None:
        decisions.append(await gate.request("deploy", {}))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)
            await wait_until_async(lambda: events, "the approval request event", timeout=30,
                                   interval=0.02)
            real = events[0].value["approvalId"]  # type: ignore[attr-defined]
            nonce, mac = real.split(".")
            forged = f"{nonce}.{'A' * len(mac)}"
            with pytest.raises(ApprovalError, match="not valid for run 'run-a'"):
                answer_approval("run-a", forged, True)
            with pytest.raises(ApprovalError, match="not valid"):
                answer_approval("run-a", "whatever", True)
            other = ApprovalSigner.from_home(corral_home / "approvals").new_id("run-b")
            with pytest.raises(ApprovalError, match="not valid for run 'run-a'"):
                answer_approval("run-a", other, True)  # minted for another run
            with pytest.raises(ApprovalError, match="not valid for run 'run-b'"):
                answer_approval("run-b", real, True)  # replayed against another run
            # a different host secret cannot mint ids this host accepts
            alien = ApprovalSigner(b"x" * 32).new_id("run-a")
            with pytest.raises(ApprovalError, match="not valid"):
                answer_approval("run-a", alien, True)
            cli = await anyio.run_process([*approve_cmd, "run-a", forged, "--allow"],
                                          env=cli_env, check=False)
            assert cli.returncode == 2
            assert b"not valid for run" in cli.stderr and b"Traceback" not in cli.stderr
            assert decisions == []  # still waiting: nothing forged got through
            answer_approval("run-a", real, False)
    assert decisions == ["denied by a human"]


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


def test_ids_never_look_like_options() -> None:
    """An id is passed to ``corral approve`` on the command line: one starting with '-'
    would be read as an option (base64url nonces start with '-' one time in 64)."""
    s = ApprovalSigner(b"k" * 32)
    ids = [s.new_id("run") for _ in range(2000)]
    assert not any(i.startswith("-") for i in ids)
    assert all(s.verify("run", i) for i in ids[:50])
