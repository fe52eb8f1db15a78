"""Generated requests against ``/openapi.json`` (schemathesis) sent to a real server:
never a 5xx, and every answer matches the documented status codes, content types and
schemas. (Hypothesis drives each operation's strategy directly: schemathesis's pytest
plugin does not run under pytest 9.) The examples are derandomized: the same generated
requests every run, so "some generated run is accepted" cannot fail by the draw (it did
once in CI: 25 positive bodies, all refused as invalid runs)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from tests.server.conftest import TOKEN, Home, Server

EXAMPLES = 25


@pytest.fixture(scope="module")
def api_server(request: pytest.FixtureRequest,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from corral.testing._plugin import require
    from tests.conftest import bwrap_works

    require(request.config, bwrap_works(), "bubblewrap with user namespaces (runs start)",
            "apt-get install bubblewrap and allow unprivileged user namespaces")
    path = Path(tmp_path_factory.mktemp("schemathesis")) / "home"
    path.mkdir()
    with Home(path).server(token=TOKEN) as server:
        yield server


OPERATIONS = [
    ("POST", "/v1/runs"),
    ("GET", "/v1/runs"),
    ("GET", "/v1/runs/{run_id}"),
    ("POST", "/v1/runs/{run_id}/cancel"),
    ("GET", "/v1/threads/{thread_id}/active"),
    ("GET", "/v1/threads"),
    ("GET", "/v1/threads/{thread_id}"),
    ("POST", "/v1/threads/{thread_id}/undo"),
    ("POST", "/v1/threads/{thread_id}/fork"),
    ("DELETE", "/v1/threads/{thread_id}"),
    ("GET", "/v1/runs/{run_id}/events"),
    ("GET", "/v1/runs/{run_id}/approvals"),
    ("POST", "/v1/runs/{run_id}/approvals/{approval_id}"),
    ("POST", "/v1/agui"),
    ("GET", "/v1/harnesses"),
]


@pytest.mark.parametrize("mode", list(schemathesis.GenerationMode), ids=lambda m: m.value)
@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_generated_requests_get_no_server_error(
    api_server: Server, method: str, path: str, mode: schemathesis.GenerationMode
) -> None:
    schema = schemathesis.openapi.from_url(f"{api_server.url}/openapi.json")
    operations = [r.ok() for r in schema.get_all_operations()]
    found = [op for op in operations if op.method.upper() == method and op.path == path]
    assert found, f"{method} {path} is missing from /openapi.json"
    assert {(op.method.upper(), op.path) for op in operations} == set(OPERATIONS)
    calls: list[int] = []

    @given(case=found[0].as_strategy(mode))
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
              database=None, derandomize=True)
    def check(case: Any) -> None:
        response = case.call_and_validate(
            base_url=api_server.url,
            headers=api_server.headers,
            timeout=30,
            checks=[not_a_server_error, status_code_conformance, content_type_conformance,
                    response_schema_conformance],
        )
        calls.append(response.status_code)

    check()
    assert calls, "no request was generated"
    if mode is schemathesis.GenerationMode.POSITIVE and method == "POST" and path == "/v1/runs":
        assert 201 in calls, f"no generated run was accepted: {sorted(calls)}"
