"""Answering a host tool's approval over HTTP: POST /v1/runs/{id}/approvals/{approval_id}."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import anyio

from corral.stores import open_store
from corral.tools._approvals import Approvals

from tests.helpers import wait_until

from .conftest import Home, ticker


def _ask(run_id: str, home: Path, out: dict[str, Any]) -> None:
    """A held tool call, as a driver's MCP server holds it, in its own thread: on the
    server's store (the SQLite file in its home)."""
    events: list[Any] = []
    out["events"] = events

    async def main() -> None:
        store = await open_store(f"sqlite://{home / 'corral.db'}")
        try:
            gate = Approvals(store, run_id, emit=events.append, timeout=30)
            out["decision"] = await gate.request("deploy", {"env": "prod"})
        finally:
            await store.aclose()

    anyio.run(main)
    out["done"] = True


def test_pending_approvals_are_listed_and_answered_over_http(home: Home) -> None:
    with home.server() as server, server.client() as c:
        run_id = server.start(ticker(400, 0.05), thread_id="ap")["run_id"]
        held: dict[str, Any] = {}
        thread = threading.Thread(target=_ask, args=(run_id, home.path, held), daemon=True)
        thread.start()
        wait_until(lambda: bool(held.get("events")), "the approval request event", timeout=20)
        approval_id = held["events"][0].value["approvalId"]

        listed = c.get(f"/v1/runs/{run_id}/approvals")
        assert listed.status_code == 200, listed.text
        (pending,) = listed.json()["approvals"]
        assert pending["approval_id"] == approval_id and pending["tool"] == "deploy"

        nonce, mac = approval_id.split(".")
        forged = c.post(f"/v1/runs/{run_id}/approvals/{nonce}.{'A' * len(mac)}",
                        json={"decision": "allow"})
        assert forged.status_code == 409 and forged.json()["error"]["code"] == "approval_refused"
        bad = c.post(f"/v1/runs/{run_id}/approvals/{approval_id}", json={"decision": "maybe"})
        assert bad.status_code == 422
        missing = c.post(f"/v1/runs/nope/approvals/{approval_id}", json={"decision": "allow"})
        assert missing.status_code == 404
        assert "done" not in held  # nothing forged or malformed released the call

        ok = c.post(f"/v1/runs/{run_id}/approvals/{approval_id}",
                    json={"decision": "allow", "reason": "looks fine"})
        assert ok.status_code == 200, ok.text
        assert ok.json() == {"approval_id": approval_id, "decision": "allow"}
        thread.join(20)
        assert held.get("done") and held["decision"] is None  # allowed: the tool may run
        again = c.post(f"/v1/runs/{run_id}/approvals/{approval_id}", json={"decision": "deny"})
        assert again.status_code == 409
        assert c.get(f"/v1/runs/{run_id}/approvals").json()["approvals"] == []
        c.post(f"/v1/runs/{run_id}/cancel")


def test_another_server_sharing_the_store_answers(home: Home, tmp_path: Path) -> None:
    """Two servers with their own ``$CORRAL_HOME`` and one store: a request of a run the
    first one started is listed and answered through the second."""
    other = Home(tmp_path / "other-home")
    other.path.mkdir()
    shared = {"CORRAL_STORE": f"sqlite://{home.db}"}
    with home.server() as first, other.server(extra_env=shared) as second, \
            second.client() as c:
        run_id = first.start(ticker(400, 0.05), thread_id="ap2")["run_id"]
        held: dict[str, Any] = {}
        thread = threading.Thread(target=_ask, args=(run_id, home.path, held), daemon=True)
        thread.start()
        wait_until(lambda: bool(held.get("events")), "the approval request event", timeout=20)
        approval_id = held["events"][0].value["approvalId"]
        (pending,) = c.get(f"/v1/runs/{run_id}/approvals").json()["approvals"]
        assert pending["approval_id"] == approval_id
        denied = c.post(f"/v1/runs/{run_id}/approvals/{approval_id}",
                        json={"decision": "deny", "reason": "not from here"})
        assert denied.status_code == 200, denied.text
        thread.join(20)
        assert held.get("done") and held["decision"] == "denied by a human: not from here"
        c.post(f"/v1/runs/{run_id}/cancel")
    assert not (other.path / "corral.db").exists()  # the second server used the shared store
