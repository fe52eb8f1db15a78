"""``corral serve`` logs in one format (its own lines, uvicorn's and one access-log line per
request), and the access log never writes the API token a URL carries (``?token=``)."""

from __future__ import annotations

import re

import httpx

from tests.server.conftest import TOKEN, Home

LINE = re.compile(
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4} corral serve: (DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    r"[\w.]+: .*\n"
)


def test_serve_logs_one_format_with_an_access_log_and_no_token(home: Home) -> None:
    server = home.spawn(token=TOKEN)
    try:
        with server.client() as c:
            assert c.get("/v1/harnesses").status_code == 200
        # the event stream's query-string token, as a browser's EventSource sends it
        r = httpx.get(f"{server.url}/v1/runs/run-nope/events?after=0&token={TOKEN}", timeout=30)
        assert r.status_code == 404
    finally:
        server.stop()
    log = server.log
    assert sum(line.startswith("corral: serving on ") for line in log) == 1, log  # for people
    others = [line for line in log if not line.startswith("corral: serving on ")]
    assert others and all(LINE.fullmatch(line) for line in others), others
    access = [line for line in others if " uvicorn.access: " in line]
    assert any('"GET /v1/harnesses HTTP/1.1" 200' in line for line in access), others
    assert any("/v1/runs/run-nope/events?after=0&token=*** HTTP/1.1\" 404" in line
               for line in access), access
    assert not any(TOKEN in line for line in log), log
