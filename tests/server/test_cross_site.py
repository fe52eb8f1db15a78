"""Attack: a web page on any site drives a loopback ``corral serve`` that has no token.

A browser sends some requests cross-site without asking first (CORS "simple" requests: a
``text/plain``, form-encoded or multipart body, or no body at all), and a sandboxed iframe,
a ``data:`` page or a redirect sends them with ``Origin: null``. Every state-changing
request must be one a browser cannot send cross-site without a preflight (a JSON content
type or the ``X-Corral-Request`` header), and ``Origin: null`` is a foreign origin.
"""

from __future__ import annotations

import threading
from typing import Any

import httpx

from tests.helpers import wait_until

from .conftest import Home, ticker
from .test_approvals_http import _ask

# What a hostile page can send without a preflight: (headers, body).
_SIMPLE = [
    ({"content-type": "text/plain;charset=UTF-8", "origin": "null"}, '{"decision":"allow"}'),
    ({"content-type": "text/plain"}, '{"decision":"allow"}'),  # a browser that omits Origin
    ({"content-type": "application/x-www-form-urlencoded", "origin": "null"},
     "decision=allow"),
    ({"content-type": "multipart/form-data; boundary=x", "origin": "null"},
     '--x\r\nContent-Disposition: form-data; name="decision"\r\n\r\nallow\r\n--x--\r\n'),
    ({"origin": "null"}, None),  # fetch(url, {method: "POST", mode: "no-cors"})
]


def _refused(r: httpx.Response) -> None:
    assert r.status_code in (403, 415), (r.status_code, r.text)
    error = r.json()["error"]
    assert error["code"] in ("cross_site_request", "cross_origin"), error
    assert "\n" not in error["message"]


def test_a_web_page_cannot_answer_an_approval_or_cancel_a_run(home: Home) -> None:
    with home.server() as server, httpx.Client(base_url=server.url, timeout=30) as page:
        run_id = server.start(ticker(2000, 0.05), thread_id="xs")["run_id"]
        held: dict[str, Any] = {}
        thread = threading.Thread(target=_ask, args=(run_id, home.path, held), daemon=True)
        thread.start()
        wait_until(lambda: bool(held.get("events")), "the approval request event", timeout=20)
        approval_id = held["events"][0].value["approvalId"]

        for headers, body in _SIMPLE:
            _refused(page.post(f"/v1/runs/{run_id}/cancel", headers=headers, content=body))
            _refused(page.post(f"/v1/runs/{run_id}/approvals/{approval_id}", headers=headers,
                               content=body))
            _refused(page.post("/v1/runs", headers=headers,
                               content='{"thread_id":"x","command":["true"]}'))
            _refused(page.post("/v1/agui", headers=headers, content="{}"))
        # Origin: null is foreign, whatever else the request carries.
        _refused(page.post(f"/v1/runs/{run_id}/approvals/{approval_id}",
                           json={"decision": "allow"}, headers={"origin": "null"}))
        _refused(page.post(f"/v1/runs/{run_id}/cancel",
                           headers={"origin": "null", "x-corral-request": "1"}))
        assert "done" not in held  # the held tool call is still waiting
        assert server.run(run_id)["status"] == "running"
        assert [r["run_id"] for r in page.get("/v1/runs").json()["runs"]] == [run_id]

        # What a program (or the server's own page) sends still works: JSON, or the header.
        ok = page.post(f"/v1/runs/{run_id}/approvals/{approval_id}",
                       json={"decision": "deny", "reason": "no"})
        assert ok.status_code == 200, ok.text
        thread.join(20)
        assert held.get("done") and held["decision"] == "denied by a human: no"
        same_origin = {"origin": server.url.rstrip("/"), "x-corral-request": "1"}
        cancelled = page.post(f"/v1/runs/{run_id}/cancel", headers=same_origin)
        assert cancelled.status_code == 200, cancelled.text


def test_the_refusal_names_what_to_send(home: Home) -> None:
    with home.server() as server, httpx.Client(base_url=server.url, timeout=30) as c:
        r = c.post("/v1/runs/nope/cancel")
        assert r.status_code == 403, r.text
        error = r.json()["error"]
        assert error["code"] == "cross_site_request"
        assert "X-Corral-Request: 1" in error["message"]
        assert "application/json" in error["message"]
        # JSON of the `+json` kind counts; the header alone makes a bodiless POST valid.
        assert c.post("/v1/runs/nope/cancel",
                      headers={"x-corral-request": "1"}).status_code == 404
        assert c.post("/v1/runs/nope/cancel", content="{}",
                      headers={"content-type": "application/merge-patch+json"}
                      ).status_code == 404
