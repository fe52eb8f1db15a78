"""Host tools: schemas from type hints or pydantic models, validation, running."""

from __future__ import annotations

import threading
from typing import Literal

import anyio
import pytest
from pydantic import BaseModel, Field

from corral._errors import ConfigError, CorralError
from corral.tools import (
    HostTool,
    ToolArgumentsError,
    ToolContext,
    Toolset,
    UnknownToolError,
    result_text,
    tool,
)

pytestmark = pytest.mark.anyio


@tool
def add(a: int, b: int = 2) -> int:
    """Add two numbers."""
    return a + b


class Query(BaseModel):
    table: Literal["users", "orders"]
    limit: int = Field(default=10, ge=1, le=100)


@tool(name="lookup", approval=True)
async def lookup_rows(q: Query) -> dict[str, object]:
    return {"table": q.table, "limit": q.limit}


def test_schema_from_type_hints() -> None:
    assert add.name == "add"
    assert add.description == "Add two numbers."
    assert add.approval is False
    s = add.input_schema
    assert s["type"] == "object"
    assert s["properties"]["a"]["type"] == "integer"
    assert s["required"] == ["a"]
    assert s["properties"]["b"]["default"] == 2
    assert s.get("additionalProperties") is False


def test_schema_from_pydantic_model_is_flattened() -> None:
    s = lookup_rows.input_schema
    assert lookup_rows.name == "lookup" and lookup_rows.approval is True
    assert set(s["properties"]) == {"table", "limit"}
    assert s["properties"]["table"]["enum"] == ["users", "orders"]


async def test_run_sync_in_thread_and_async() -> None:
    seen: list[bool] = []

    @tool
    def where() -> str:
        seen.append(threading.current_thread() is threading.main_thread())
        return "ok"

    ts = Toolset([add, lookup_rows, where])
    assert await ts.call("add", {"a": 1}) == 3
    assert await ts.call("lookup", {"table": "users", "limit": 5}) == {"table": "users",
                                                                      "limit": 5}
    assert await ts.call("where", None) == "ok"
    assert seen == [False]  # a sync tool does not run on the event loop's thread


async def test_bad_arguments_name_every_field() -> None:
    ts = Toolset([add, lookup_rows])
    with pytest.raises(ToolArgumentsError) as e:
        await ts.call("add", {"a": "x", "c": 1})
    msg = str(e.value)
    assert "'add'" in msg and "a:" in msg and "c:" in msg
    with pytest.raises(ToolArgumentsError, match="limit"):
        await ts.call("lookup", {"table": "users", "limit": 0})
    with pytest.raises(ToolArgumentsError, match="JSON object"):
        await ts.call("add", [1, 2])
    assert isinstance(e.value, CorralError)


async def test_unknown_tool() -> None:
    with pytest.raises(UnknownToolError, match="'nope'.*known: add"):
        await Toolset([add]).call("nope", {})


async def test_context_injected_not_in_schema() -> None:
    @tool
    def who(ctx: ToolContext, x: int) -> str:
        return f"{ctx.tool}:{ctx.run_id}:{x}"

    assert set(who.input_schema["properties"]) == {"x"}
    assert await who.run({"x": 1}, ToolContext(tool="who", run_id="r1")) == "who:r1:1"


def test_definition_errors() -> None:
    def untyped(a):  # type: ignore[no-untyped-def]
        return a

    def star(*a: int) -> None: ...

    with pytest.raises(ConfigError, match="type hint"):
        HostTool.from_function(untyped)
    with pytest.raises(ConfigError, match=r"\*args"):
        HostTool.from_function(star)
    with pytest.raises(ConfigError, match="invalid"):
        HostTool.from_function(add.fn, name="bad name!")
    with pytest.raises(ConfigError, match="unique"):
        Toolset([add, add])


def test_result_text() -> None:
    assert result_text("plain") == "plain"
    assert result_text({"b": 1, "a": [1, 2]}) == '{"a": [1, 2], "b": 1}'
    assert result_text(Query(table="users")) == '{"limit": 10, "table": "users"}'


async def test_slow_sync_tool_is_abandoned_on_cancel() -> None:
    release = threading.Event()

    @tool
    def slow() -> str:
        release.wait(10)
        return "late"

    with anyio.move_on_after(0.2) as scope:
        await slow.run({})
    release.set()
    assert scope.cancelled_caught
