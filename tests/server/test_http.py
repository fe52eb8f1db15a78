"""The HTTP API against a real ``corral serve`` process on 127.0.0.1 (bubblewrap sandboxes,
SQLite store): start, stream, resume, cancel, active run, errors, auth."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import httpx
from tests.server.conftest import (
    TOKEN,
    Home,
    read_stream,
    sse_events,
    ticker,
    ticker_text,
)
from tests.helpers import wait_until


def text_of(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")


def test_start_stream_list_and_show(home: Home) -> None:
    with home.server() as server:
        created = server.start(ticker(5, 0.02), thread_id="th-1", run_id="r-1")
        assert created == {"run_id": "r-1", "thread_id": "th-1", "status": "running",
                           "events_url": "/v1/runs/r-1/events"}
        got, ended = read_stream(server, "r-1")
        assert ended
        assert [o for o, _ in got] == list(range(1, len(got) + 1))
        events = [e for _, e in got]
        assert events == home.log("r-1")
        assert events[0]["type"] == "RUN_STARTED" and events[-1]["type"] == "RUN_FINISHED"
        assert text_of(events) == ticker_text(5)

        wait_until(lambda: server.run("r-1")["status"] == "completed",
                   "completed record", timeout=20)
        record = server.run("r-1")
        assert record["exit_code"] == 0 and record["command"] == ticker(5, 0.02)
        raw = json.dumps(record)
        nonce = home.raw("r-1")["journal"]["nonce"]
        assert nonce not in raw and "journal" not in record and "claim_owner" not in record

        with server.client() as c:
            r = c.post("/v1/runs", json={"thread_id": "th-2", "command": ["true"]})
            assert r.status_code == 201 and r.headers["location"] == f"/v1/runs/{r.json()['run_id']}"
            second = r.json()
            listed = c.get("/v1/runs").json()["runs"]
            assert [r["run_id"] for r in listed] == [second["run_id"], "r-1"]
            by_thread = c.get("/v1/runs", params={"thread_id": "th-1"}).json()["runs"]
            assert [r["run_id"] for r in by_thread] == ["r-1"]
            done = c.get("/v1/runs", params={"status": "completed"}).json()["runs"]
            assert "r-1" in [r["run_id"] for r in done]
            # A finished run's stream from its end: nothing more, and EventSource stops.
            assert c.get("/v1/runs/r-1/events", params={"after": len(got)}).status_code == 204
        with server.client() as c:
            openapi = c.get("/openapi.json").json()
        assert {"/v1/runs", "/v1/runs/{run_id}", "/v1/runs/{run_id}/events",
                "/v1/runs/{run_id}/cancel", "/v1/threads/{thread_id}/active"} <= set(openapi["paths"])


def test_resume_after_disconnect_has_no_duplicate_and_no_gap(home: Home) -> None:
    with home.server("--heartbeat", "0.2") as server:
        run_id = server.start(ticker(40, 0.05), run_id="resume")["run_id"]
        first, ended = read_stream(server, run_id, limit=8)
        assert not ended and [o for o, _ in first] == list(range(1, 9))
        # The viewer left: the run goes on, marked as unwatched.
        wait_until(lambda: server.run(run_id).get("detached_since") is not None,
                   "detached_since after the viewer left", timeout=10)
        last = first[-1][0]
        rest, ended = read_stream(server, run_id, last_event_id=last, after=0)
        assert ended
        offsets = [o for o, _ in first + rest]
        assert offsets == list(range(1, len(offsets) + 1)), "a duplicate or a gap"
        events = [e for _, e in first + rest]
        assert events == home.log(run_id)
        assert text_of(events) == ticker_text(40)

        # ?after= resumes the same way (what a reloaded page sends).
        tail, ended = read_stream(server, run_id, after=len(events) - 3)
        assert ended and [e for _, e in tail] == events[-3:]


def test_a_viewer_arriving_clears_detached_since(home: Home) -> None:
    with home.server() as server:
        run_id = server.start(ticker(100, 0.05))["run_id"]
        assert server.run(run_id)["detached_since"] is not None  # nobody watches yet
        seen: dict[str, Any] = {}
        with httpx.Client(base_url=server.url, timeout=30) as c, c.stream(
            "GET", f"/v1/runs/{run_id}/events"
        ) as r:
            for _name, ident, _data in sse_events(r.iter_lines()):
                if ident == "3":
                    seen["while_watching"] = server.run(run_id)["detached_since"]
                    break
        assert seen["while_watching"] is None
        wait_until(lambda: server.run(run_id)["detached_since"] is not None,
                   "detached_since again after the viewer left", timeout=10)
        with server.client() as c:
            assert c.post(f"/v1/runs/{run_id}/cancel").status_code == 200


def test_heartbeats_keep_an_idle_stream_alive(home: Home) -> None:
    with home.server("--heartbeat", "0.2") as server:
        run_id = server.start(["sh", "-c", "sleep 1.5; echo late"])["run_id"]
        comments: list[str] = []
        names: list[str | None] = []
        with httpx.Client(base_url=server.url, timeout=30) as c, c.stream(
            "GET", f"/v1/runs/{run_id}/events"
        ) as r:
            for name, _ident, data in sse_events(r.iter_lines(), on_comment=comments.append):
                names.append(name)
                if name is None and json.loads(data).get("delta") == "late":
                    heartbeats_before = len(comments)
                if name == "end":
                    break
        assert heartbeats_before >= 3, comments
        assert names[-1] == "end"


def test_every_frame_with_data_is_an_ag_ui_event(home: Home) -> None:
    """AG-UI clients take any frame with data for an event and fail on one without a
    ``type``: the end of a closed log must be a comment, not an ``event: end`` frame."""
    with home.server() as server:
        run_id = server.start(["echo", "hi"])["run_id"]
        wait_until(lambda: server.run(run_id)["status"] == "completed", "the run's end")
        with server.client() as c:
            body = c.get(f"/v1/runs/{run_id}/events").text
    frames = [f for f in body.split("\n\n") if f]
    assert frames[-1] == ": end", frames[-3:]
    for frame in frames:
        fields = [line.partition(":")[0] for line in frame.splitlines()]
        assert "event" not in fields, frame
        data = [line[len("data: "):] for line in frame.splitlines() if line.startswith("data:")]
        if data:
            assert isinstance(json.loads("\n".join(data)).get("type"), str), frame
    assert '"type":"RUN_FINISHED"' in frames[-2]


def test_cancel(home: Home) -> None:
    with home.server() as server:
        run_id = server.start(ticker(600, 0.05), thread_id="c")["run_id"]
        got, _ = read_stream(server, run_id, limit=4)
        with server.client() as c:
            r = c.post(f"/v1/runs/{run_id}/cancel")
            assert r.status_code == 200, r.text
            assert r.json()["status"] == "aborted" and r.json()["cancel_requested"] is True
            again = c.post(f"/v1/runs/{run_id}/cancel")
            assert again.status_code == 200 and again.json()["status"] == "aborted"
            missing = c.post("/v1/runs/nope/cancel")
            assert missing.status_code == 404 and missing.json()["error"]["code"] == "run_not_found"
        rest, ended = read_stream(server, run_id, after=len(got))
        assert ended and rest[-1][1]["type"] == "RUN_ERROR"
        assert [e for _, e in got + rest] == home.log(run_id)


def test_active_run_of_a_thread(home: Home) -> None:
    with home.server() as server, server.client() as c:
        idle = c.get("/v1/threads/quiet/active")
        assert idle.status_code == 404 and idle.json()["error"]["code"] == "no_active_run"
        run_id = server.start(ticker(600, 0.05), thread_id="busy")["run_id"]
        active = c.get("/v1/threads/busy/active")
        assert active.status_code == 200 and active.json()["run_id"] == run_id
        assert c.post(f"/v1/runs/{run_id}/cancel").status_code == 200
        assert c.get("/v1/threads/busy/active").status_code == 404


def test_bad_input_gets_a_clear_4xx(home: Home, tmp_path: Any) -> None:
    with home.server() as server, server.client() as c:

        def post(body: Any, **kw: Any) -> httpx.Response:
            return c.post("/v1/runs", json=body, **kw)

        cases: list[tuple[httpx.Response, int, str]] = [
            (post({"command": ["true"]}), 422, "thread_id"),
            (post({"thread_id": "t"}), 422, "command"),
            (post({"thread_id": "t", "command": ["true"], "prompt": "hi"}), 422, "not both"),
            (post({"thread_id": "t", "prompt": "hi"}), 422, "harness"),
            (post({"thread_id": "../x", "command": ["true"]}), 422, "thread_id"),
            (post({"thread_id": "t", "command": []}), 422, "command"),
            (post({"thread_id": "t", "command": ["a\u0000b"]}), 422, "NUL"),
            (post({"thread_id": "t", "command": ["true"], "surprise": 1}), 422, "surprise"),
            (post({"thread_id": "t", "command": ["true"], "timeout": 0}), 422, "timeout"),
            (post({"thread_id": "t", "command": ["true"], "token_budget": 9}), 422,
             "token_budget"),
            (post({"thread_id": "t", "prompt": "hi", "harness": "codex", "token_budget": 0}),
             422, "token_budget"),
            (post({"thread_id": "t", "prompt": "hi", "harness": "nosuch"}), 400, "nosuch"),
            (post({"thread_id": "t", "command": ["true"], "output_schema": {"type": "object"}}),
             422, "output_schema"),
            (post({"thread_id": "t", "prompt": "hi", "harness": "codex",
                   "output_schema": {"type": "string"}}), 400, "object at its root"),
            (post({"thread_id": "t", "command": ["true"], "sandbox": {"provider": "local"}}),
             400, "not allowed"),
            (post({"thread_id": "t", "command": ["true"],
                   "sandbox": {"workspace": str(tmp_path)}}), 400, "workspace_roots"),
            (post({"thread_id": "t", "command": ["true"], "sandbox": "nope"}), 400, "nope"),
            (c.post("/v1/runs", content=b"{not json", headers={"content-type": "application/json"}),
             422, "JSON"),
            (c.post("/v1/runs", content=b"x" * (2 << 20),
                    headers={"content-type": "application/json"}), 413, "larger"),
            (c.get("/v1/runs/nope"), 404, "nope"),
            (c.get("/v1/runs/nope/events"), 404, "nope"),
            (c.get("/v1/runs", params={"status": "sleeping"}), 422, "status"),
            (c.get("/v1/runs", params={"limit": "0"}), 422, "limit"),
            (c.get("/v1/nothing-here"), 404, "Not Found"),
            (c.post("/v1/runs", json={"thread_id": "t", "command": ["true"]},
                    headers={"origin": "http://evil.example"}), 403, "origin"),
            (c.get("/v1/runs", headers={"host": "evil.example"}), 403, "loopback"),
        ]
        run_id = server.start(["true"], run_id="dup")["run_id"]
        cases.append((post({"thread_id": "t", "run_id": run_id, "command": ["true"]}), 409,
                      "already exists"))
        cases.append((c.get(f"/v1/runs/{run_id}/events", headers={"last-event-id": "x1"}), 400,
                      "Last-Event-ID"))
        for response, status, words in cases:
            assert response.status_code == status, (response.request.url, response.text)
            body = response.json()
            assert set(body) == {"error"} and body["error"]["message"], body
            assert words.lower() in json.dumps(body).lower(), (words, body)


def test_auth(home: Home) -> None:
    with home.server(token=TOKEN) as server:
        run_id = server.start(["true"], run_id="auth")["run_id"]  # with the token
        with httpx.Client(base_url=server.url, timeout=30) as anon:
            for bad in ({}, {"Authorization": "Bearer wrong"},
                        {"Authorization": f"Basic {TOKEN}"},
                        {"Authorization": f"Bearer {TOKEN}x"}):
                r = anon.get("/v1/runs", headers=bad)
                assert r.status_code == 401, (bad, r.text)
                assert r.json()["error"]["code"] == "unauthorized"
                assert r.headers["www-authenticate"].startswith("Bearer")
            ok = anon.get("/v1/runs", headers={"Authorization": f"Bearer {TOKEN}"})
            assert ok.status_code == 200
            # ?token= is for EventSource, on the event stream only.
            assert anon.get("/v1/runs", params={"token": TOKEN}).status_code == 401
            assert anon.post(f"/v1/runs/{run_id}/cancel", params={"token": TOKEN}).status_code == 401
            assert anon.get(f"/v1/runs/{run_id}/events", params={"token": "nope"}).status_code == 401
            wait_until(lambda: server.run(run_id)["status"] == "completed", "run end", timeout=20)
            events = anon.get(f"/v1/runs/{run_id}/events", params={"token": TOKEN})
            assert events.status_code == 200 and "RUN_FINISHED" in events.text
            # The page itself is public; it asks for the token.
            page = anon.get("/")
            assert page.status_code == 200 and "app.js" in page.text
            assert anon.get("/static/app.js").status_code == 200


def _serve_refused(home: Home, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(home.env)
    if token is not None:
        env["CORRAL_API_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "corral.server", "--port", "0", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def test_non_loopback_bind_without_token_refuses_to_start(home: Home) -> None:
    for host in ("0.0.0.0", "::", "192.0.2.1"):
        out = _serve_refused(home, "--host", host)
        assert out.returncode == 2, out.stderr
        assert "CORRAL_API_TOKEN" in out.stderr and "Traceback" not in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1
    short = _serve_refused(home, "--host", "0.0.0.0", token="short")
    assert short.returncode == 2 and "too short" in short.stderr
    bad_store = _serve_refused(home, "--store", "mysql://x")
    assert bad_store.returncode == 2 and "scheme" in bad_store.stderr


def test_memory_store_warns_at_start_up(home: Home) -> None:
    with home.server("--store", "memory://") as server:
        assert server.start(["true"])["status"] == "running"
        text = "".join(server.log)
        assert "cannot share" in text or "other server processes" in text, text


def test_a_run_with_a_timeout_is_stopped(home: Home) -> None:
    with home.server() as server, server.client() as c:
        r = c.post("/v1/runs", json={"thread_id": "t", "run_id": "slow", "timeout": 1,
                                     "command": ["sh", "-c", "sleep 60"]})
        assert r.status_code == 201, r.text
        wait_until(lambda: server.run("slow")["status"] != "running", "the timeout", timeout=40)
        rec = server.run("slow")
        assert (rec["status"], rec["exit_code"]) == ("failed", 124), rec


def test_a_run_with_file_events_streams_them(home: Home) -> None:
    with home.server() as server:
        server.start(["sh", "-c", "echo x > made.txt"], run_id="fe", file_events=True)
        got, ended = read_stream(server, "fe")
        assert ended
        files = [e["value"] for _, e in got if e["type"] == "CUSTOM" and e["name"] == "sandbox.file"]
        assert [(f["type"], f["path"]) for f in files] == [("create", "made.txt")]
        assert got[-1][1]["type"] == "RUN_FINISHED"
