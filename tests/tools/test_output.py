"""Structured output's checks without an agent: the schema at definition time, the
validator, the size limits, the ``submit_result`` tool's bounded retries, the settle step
at the run's end, and the record's ``output`` field."""

from __future__ import annotations

import json
from typing import Any

import anyio
import jsonschema  # type: ignore[import-untyped]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral._errors import ConfigError
from corral.runs._output_end import OUTPUT_INVALID, settle_output
from corral.runs._pipe import LogBatch
from corral.runs._request import RunRequest
from corral.stores._memory import MemoryStore
from corral.stores._protocols import NewRun
from corral.stores._records import (
    MAX_OUTPUT_BYTES,
    CorruptRecord,
    RunPatch,
    RunRecord,
    RunStatus,
)
from corral.tools._core import ToolError
from corral.tools._output import (
    MAX_SCHEMA_BYTES,
    OutputState,
    SubmitResultTool,
    check_output_schema,
    output_error,
)

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
          "additionalProperties": False}


@pytest.mark.parametrize("schema, words", [
    ([], "must be a JSON object"),
    ({"type": "array"}, "object at its root"),
    ({"type": "object", "properties": {"n": {"type": "nope"}}}, "/properties/n"),
    ({"type": "object", "minProperties": -1}, "not a valid JSON Schema"),
    ({"type": "object", "x": float("nan")}, "not JSON"),
    ({"type": "object", "description": "x" * MAX_SCHEMA_BYTES}, "larger than"),
])
def test_a_bad_schema_is_one_line(schema: Any, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_output_schema(schema)
    message = str(err.value)
    assert words in message and "\n" not in message, message


def test_a_bad_schema_is_refused_when_the_run_is_defined() -> None:
    with pytest.raises(ConfigError, match="object at its root"):
        RunRequest(prompt="hi", harness="claude-code", output_schema={"type": "string"})
    with pytest.raises(ConfigError, match="command harness"):
        RunRequest(command=["true"], output_schema=SCHEMA)
    request = RunRequest(prompt="hi", harness="codex", output_schema=SCHEMA)
    assert request.output_schema == SCHEMA


def test_the_validator_names_where_and_what() -> None:
    assert output_error(SCHEMA, {"n": 1}) is None
    error = output_error(SCHEMA, {"n": "one"})
    assert error is not None and error.startswith("at /n:") and "integer" in error
    assert "required" in (output_error(SCHEMA, {}) or "")
    assert output_error(SCHEMA, [1]) == "the result must be a JSON object, got an array"
    big = {"type": "object"}
    assert "bytes as JSON" in (output_error(big, {"s": "x" * MAX_OUTPUT_BYTES}) or "")


def test_a_remote_ref_is_never_fetched() -> None:
    schema = check_output_schema({"type": "object", "properties": {
        "a": {"$ref": "http://127.0.0.1:9/never.json"}}})
    error = output_error(schema, {"a": 1})
    assert error is not None and error.startswith("the output schema cannot be applied")


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                 max_size=3),
    max_leaves=10)


@settings(max_examples=200, deadline=None)
@given(value=st.dictionaries(st.text(max_size=4), _json, max_size=4))
def test_the_validator_agrees_with_jsonschema(value: dict[str, Any]) -> None:
    """Whatever the agent sends, the verdict is jsonschema's (never an exception)."""
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0},
                                               "s": {"type": "string"}},
              "required": ["n"]}
    ok = jsonschema.Draft202012Validator(schema).is_valid(value)
    assert (output_error(schema, value) is None) == ok


def test_submit_result_retries_are_bounded() -> None:
    stored: list[dict[str, Any]] = []

    async def keep(value: dict[str, Any]) -> None:
        stored.append(value)

    state = OutputState(check_output_schema(SCHEMA), retries=2, on_valid=keep)
    tool = SubmitResultTool(state)
    assert tool.input_schema == SCHEMA  # the agent sees the schema as the tool's input

    async def main() -> None:
        for left in ("2 tries left", "1 try left"):
            with pytest.raises(ToolError, match=left):
                await tool.run({"n": "x"})
        with pytest.raises(ToolError, match="No tries are left"):
            await tool.run({"n": "x"})
        with pytest.raises(ToolError, match="no more tries"):
            await tool.run({"n": 1})  # even a valid one: the bound is the bound

    anyio.run(main)
    assert state.exhausted and stored == [] and state.value is None
    assert state.last_error is not None and "integer" in state.last_error

    ok = OutputState(check_output_schema(SCHEMA), on_valid=keep)
    assert "accepted" in anyio.run(SubmitResultTool(ok).run, {"n": 3})
    assert stored == [{"n": 3}] and ok.value == {"n": 3}


def test_the_retries_are_the_runs_a_successor_driver_continues_the_count() -> None:
    """Each driver's state starts from the count stored on the record (``output_tries``):
    a driver that takes the run over gives the agent the tries that are left, not fresh
    ones; a driver whose claim was taken over can no longer write the count."""
    from corral.runs._output_end import output_state
    from corral.stores._protocols import ClaimLost

    schema = check_output_schema(SCHEMA)

    async def main() -> None:
        store = MemoryStore()
        await store.create(NewRun("run-o", "t", spec={"version": 1, "output_schema": schema}))
        first = await store.acquire_claim("run-o", "driver-1", 60.0)
        state = await output_state(store, _record(schema), schema, None, epoch=first.epoch)
        with pytest.raises(ToolError, match="2 tries left"):
            await SubmitResultTool(state).run({"n": "x"})
        rec = await store.get("run-o")
        assert rec is not None and rec.output_tries is not None
        assert rec.output_tries["invalid"] == 1 and "integer" in rec.output_tries["error"]
        # driver-1 dies; its successor breaks the lease and continues the count
        second = await store.acquire_claim("run-o", "driver-2", 60.0,
                                           break_lease_of="driver-1")
        later = await output_state(store, _record(schema), schema, None, epoch=second.epoch)
        assert later.invalid == 1 and later.last_error == state.last_error
        with pytest.raises(ToolError, match="1 try left"):
            await SubmitResultTool(later).run({"n": "y"})
        with pytest.raises(ClaimLost):  # the dead driver's late write is fenced
            await SubmitResultTool(state).run({"n": "z"})
        with pytest.raises(ToolError, match="No tries are left"):
            await SubmitResultTool(later).run({"n": "w"})
        rec = await store.get("run-o")
        assert rec is not None and rec.output_tries is not None
        assert rec.output_tries["invalid"] == 3

    anyio.run(main)


def _record(schema: dict[str, Any] | None = SCHEMA) -> RunRecord:
    return RunRecord(run_id="run-o", thread_id="t", status=RunStatus.RUNNING,
                     started_at=1.0, updated_at=1.0,
                     spec={"version": 1, "output_schema": schema})


async def _settled(batches: list[LogBatch], state: OutputState, store: MemoryStore
                   ) -> list[dict[str, Any]]:
    async def produced() -> Any:
        for b in batches:
            yield b

    out: list[dict[str, Any]] = []
    it: Any = settle_output(produced(), store, _record(), state)
    async for item in it:
        assert isinstance(item, LogBatch)
        out += [dict(e) for e in item.events]
    return out


FINISHED = {"type": "RUN_FINISHED", "threadId": "t", "runId": "run-o"}


def _candidate(value: Any) -> dict[str, Any]:
    return {"type": "CUSTOM", "name": "corral.output_candidate", "value": value}


@pytest.mark.parametrize("candidate, expected", [
    ({"value": {"n": 7}}, {"n": 7}),
    ({"value": {"n": "seven"}}, None),
    ({"error": "the final message is not JSON (x)"}, None),
])
def test_settle_puts_the_output_before_the_end_or_fails(candidate: Any, expected: Any
                                                        ) -> None:
    async def main() -> tuple[list[dict[str, Any]], RunRecord | None]:
        store = MemoryStore()
        await store.create(NewRun("run-o", "t", spec={"version": 1, "output_schema": SCHEMA}))
        state = OutputState(check_output_schema(SCHEMA))

        async def keep(value: dict[str, Any]) -> None:
            await store.update("run-o", RunPatch(output=value))

        state.on_valid = keep
        events = await _settled([LogBatch([_candidate(candidate)], 5),
                                 LogBatch([FINISHED], 6, exit_code=0)], state, store)
        return events, await store.get("run-o")

    events, record = anyio.run(main)
    assert "corral.output_candidate" not in json.dumps(events)
    if expected is not None:
        assert events == [{"type": "CUSTOM", "name": "corral.output", "value": expected},
                          FINISHED]
        assert record is not None and record.output == expected
    else:
        (error,) = events
        assert error["type"] == "RUN_ERROR" and error["code"] == OUTPUT_INVALID
        assert "no result matching its output schema" in error["message"]


def test_settle_reads_a_result_a_predecessor_stored() -> None:
    """A successor resuming after the result finds it on the record."""
    async def main() -> list[dict[str, Any]]:
        store = MemoryStore()
        await store.create(NewRun("run-o", "t", spec={"version": 1, "output_schema": SCHEMA}))
        await store.update("run-o", RunPatch(output={"n": 1}))
        return await _settled([LogBatch([FINISHED], 6, exit_code=0)],
                              OutputState(check_output_schema(SCHEMA)), store)

    assert anyio.run(main)[0] == {"type": "CUSTOM", "name": "corral.output", "value": {"n": 1}}


def test_the_record_keeps_output_within_its_limit() -> None:
    rec = RunPatch(output={"n": 1}).apply(_record(), 2.0)
    assert rec.to_dict()["output"] == {"n": 1}
    assert RunRecord.from_dict(rec.to_dict()) == rec
    with pytest.raises(CorruptRecord, match="larger than"):
        RunPatch(output={"s": "x" * MAX_OUTPUT_BYTES})
    with pytest.raises(CorruptRecord, match="JSON object"):
        RunRecord.from_dict({**rec.to_dict(), "output": [1]})
    assert "output" not in _record().to_dict()  # no output: no key (the shape is kept)




def test_a_secret_in_the_result_is_redacted_before_it_is_stored() -> None:
    """The agent puts a secret's value in its result: the record (and so the API, ``corral
    show`` and ``CUSTOM corral.output``) holds it redacted, like every event."""
    from corral.runs._output_end import output_state
    from corral.sandbox._redact import Redactor

    secret = "s3cr3t-value-0123456789"
    redactor = Redactor()
    redactor.add("API_TOKEN", secret)
    schema = check_output_schema({"type": "object", "properties": {"s": {"type": "string"}}})

    async def main() -> tuple[RunRecord | None, list[dict[str, Any]]]:
        store = MemoryStore()
        await store.create(NewRun("run-o", "t", spec={"version": 1, "output_schema": schema}))
        state = await output_state(store, _record(schema), schema, redactor.redact_obj)
        assert "accepted" in await SubmitResultTool(state).run({"s": f"it is {secret}"})

        async def produced() -> Any:
            yield LogBatch([FINISHED], 6, exit_code=0)

        events: list[dict[str, Any]] = []
        it: Any = settle_output(produced(), store, _record(schema), state, redactor.redact_obj)
        async for item in it:
            events += [dict(e) for e in item.events]
        return await store.get("run-o"), events

    record, events = anyio.run(main)
    assert record is not None and record.output is not None
    assert secret not in json.dumps(record.output) and secret not in json.dumps(events)
    assert "API_TOKEN" in json.dumps(record.output)


@pytest.mark.parametrize("harness, file_text, words", [
    ("codex", "{not json", "not JSON"),
    ("codex", '{"type": "array"}', "object at its root"),
    ("codex", None, "cannot read it"),
    ("command", '{"type": "object"}', "command harness"),
])
def test_corral_run_refuses_a_bad_output_schema_in_one_line(
        cli_env: dict[str, str], corral_cmd: list[str], tmp_path: Any, harness: str,
        file_text: str | None, words: str) -> None:
    import subprocess

    path = tmp_path / "schema.json"
    if file_text is not None:
        path.write_text(file_text)
    argv = ["--", "true"] if harness == "command" else ["hi"]
    out = subprocess.run([*corral_cmd, "run", "--harness", harness, "--output-schema",
                          str(path), *argv], env=cli_env, capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in out.stderr, out.stderr
