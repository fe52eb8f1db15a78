"""Threads over HTTP (#27) against a real ``corral serve`` (bubblewrap, SQLite): list, show,
undo, fork, delete (``?runs=true``: the runs too); refused while a run is active (409) and, without a token, from a web
page (the cross-site guard)."""

from __future__ import annotations

from typing import Any

import httpx

from tests.server.conftest import Home, Server, read_stream, ticker


def turn(server: Server, thread: str, run_id: str, script: str) -> str:
    """Run ``script`` as a turn of ``thread`` to its end; what it printed."""
    server.start(["sh", "-c", script], thread_id=thread, run_id=run_id)
    events, ended = read_stream(server, run_id)
    assert ended
    return "".join(e.get("delta", "") for _, e in events
                   if e["type"] == "TEXT_MESSAGE_CONTENT")


def test_list_show_undo_fork_and_delete_a_thread(home: Home) -> None:
    with home.server() as server, server.client() as c:
        turn(server, "th", "r1", "echo one > f.txt")
        assert turn(server, "th", "r2", "cat f.txt; echo two > f.txt").strip() == "one"
        listed = c.get("/v1/threads").json()["threads"]
        assert [(t["thread_id"], t["runs"], t["last_status"]) for t in listed] == [
            ("th", 2, "completed")]
        shown: dict[str, Any] = c.get("/v1/threads/th").json()
        assert [r["run_id"] for r in shown["runs"]] == ["r1", "r2"]
        assert shown["head"] == shown["checkpoints"][-1]["checkpoint_id"]
        assert c.get("/v1/threads/nope").json()["error"]["code"] == "thread_not_found"

        undone = c.post("/v1/threads/th/undo")
        assert undone.status_code == 200, undone.text
        assert [r["run_id"] for r in undone.json()["runs"] if r.get("undone_at")] == ["r2"]
        assert c.get("/v1/runs/r2").json()["undone_at"] is not None
        assert turn(server, "th", "r3", "cat f.txt").strip() == "one"

        forked = c.post("/v1/threads/th/fork", json={"as": "fk", "at": "r1"})
        assert forked.status_code == 200, forked.text
        assert forked.json()["thread_id"] == "fk"
        assert turn(server, "fk", "r4", "cat f.txt").strip() == "one"
        taken = c.post("/v1/threads/th/fork", json={"as": "fk"})
        assert taken.status_code == 409 and "exists already" in taken.json()["error"]["message"]
        bad = c.post("/v1/threads/th/fork", json={"as": "../x"})
        assert bad.status_code in (400, 422), bad.text

        removed = c.delete("/v1/threads/fk")
        assert removed.status_code == 200, removed.text
        assert removed.json()["checkpoints"] >= 1
        assert c.get("/v1/threads/fk").json()["runs"][0]["run_id"] == "r4"  # runs kept
        gone = c.delete("/v1/threads/fk", params={"runs": "true"})
        assert gone.status_code == 200, gone.text
        assert gone.json()["runs"] == 1 and gone.json()["checkpoints"] == 0
        assert c.get("/v1/threads/fk").status_code == 404
        assert c.get("/v1/runs/r4").status_code == 404
        assert c.get("/v1/runs/r3").status_code == 200  # the thread it was forked from


def test_undo_and_delete_are_refused_while_a_run_is_active(home: Home) -> None:
    with home.server() as server, server.client() as c:
        turn(server, "busy", "r1", "echo one > f.txt")
        server.start(ticker(600, 0.05), thread_id="busy", run_id="r2")
        for r in (c.post("/v1/threads/busy/undo"), c.delete("/v1/threads/busy")):
            assert r.status_code == 409 and r.json()["error"]["code"] == "thread_busy", r.text
            assert "r2" in r.json()["error"]["message"]
        assert c.post("/v1/runs/r2/cancel").status_code == 200


def test_a_web_page_cannot_undo_or_delete_a_thread(home: Home) -> None:
    """A page on any site posts to a loopback server without a token: no JSON type, no
    ``X-Corral-Request`` (which it cannot send cross-site without a preflight)."""
    with home.server() as server:
        turn(server, "th", "r1", "echo one > f.txt")
        with httpx.Client(base_url=server.url, timeout=30) as page:
            for r in (page.post("/v1/threads/th/undo"),
                      page.delete("/v1/threads/th"),
                      page.post("/v1/threads/th/fork", content='{"as": "x"}',
                                headers={"Content-Type": "text/plain"})):
                assert r.status_code == 403, r.text
        with server.client() as c:
            assert [r.get("undone_at") for r in c.get("/v1/threads/th").json()["runs"]] \
                == [None]
            assert c.get("/v1/threads/x").status_code == 404
