"""Structured output: a run's result as a JSON object matching a JSON Schema.

A run may ask for one (``RunRequest(output_schema=...)``). :func:`check_output_schema`
checks the schema when the run is defined (a bad schema is one line, never a traceback);
:func:`output_error` validates a result against it (JSON Schema, the draft the schema's
``$schema`` names, 2020-12 by default; no remote ``$ref`` is ever fetched).

Where the agent CLI has no native structured output, the run's MCP server ``corral``
offers :class:`SubmitResultTool` (``submit_result``): the agent calls it with the result
as its arguments; a result that does not match is answered with the validation error, so
the agent can try again, at most :data:`DEFAULT_OUTPUT_RETRIES` more times in the whole
run (:class:`OutputState` counts them; the Runner keeps the count on the run record, so a
driver that takes the run over continues it rather than starting again).

jsonschema (~30 ms of imports) loads when a schema is checked: every agent run's start
imports this module, and few runs have a schema.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from corral._errors import ConfigError
from corral.stores._records import MAX_OUTPUT_BYTES, CorruptRecord, output_size
from corral.tools._core import ToolContext, ToolError

__all__ = [
    "DEFAULT_OUTPUT_RETRIES",
    "MAX_OUTPUT_BYTES",
    "MAX_SCHEMA_BYTES",
    "OUTPUT_CANDIDATE_EVENT",
    "OUTPUT_EVENT",
    "SUBMIT_TOOL",
    "OutputState",
    "SubmitResultTool",
    "check_output_schema",
    "output_error",
    "submit_instructions",
]

OUTPUT_EVENT: Final = "corral.output"
"""The CUSTOM event, just before the run's ``RUN_FINISHED``, whose value is the result."""
OUTPUT_CANDIDATE_EVENT: Final = "corral.output_candidate"
"""A translator's CUSTOM event carrying a result the agent CLI produced natively (Claude
Code's ``structured_output``, Codex's final message): corral validates it and takes it out
of the log (:mod:`corral.runs._output_end`)."""
SUBMIT_TOOL: Final = "submit_result"
"""The host tool through which an agent without native structured output gives it."""
MAX_SCHEMA_BYTES: Final = 32 * 1024
"""The largest output schema, as JSON (it travels in the run's spec and an agent's argv)."""
DEFAULT_OUTPUT_RETRIES: Final = 2
"""How many more answers an agent may give after one that does not match the schema."""
MAX_ERROR_CHARS: Final = 600


def check_output_schema(schema: object) -> dict[str, Any]:
    """``schema`` as a plain dict if it is a JSON Schema for an object result; else raises
    :class:`ConfigError` naming what is wrong (one line)."""
    if not isinstance(schema, Mapping):
        raise ConfigError(f"output schema must be a JSON object (a JSON Schema), got "
                          f"{type(schema).__name__}")
    try:
        text = json.dumps(schema, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ConfigError(f"output schema is not JSON: {exc}") from None
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SCHEMA_BYTES:
        raise ConfigError(f"output schema is larger than {MAX_SCHEMA_BYTES} bytes as JSON; "
                          "describe the result more briefly")
    plain: dict[str, Any] = json.loads(text)
    if plain.get("type") != "object":
        raise ConfigError('output schema must describe a JSON object at its root '
                          '({"type": "object", ...}): agent CLIs return results as objects')
    from jsonschema.exceptions import SchemaError  # type: ignore[import-untyped]
    from jsonschema.validators import validator_for  # type: ignore[import-untyped]

    try:
        cls = validator_for(plain)
        cls.check_schema(plain)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        raise ConfigError(f"output schema is not a valid JSON Schema"
                          f"{f' at /{where}' if where else ''}: {_short(exc.message)}"
                          ) from None
    except Exception as exc:  # noqa: BLE001 - e.g. an unknown $schema dialect
        raise ConfigError(f"output schema is not a valid JSON Schema: {_short(str(exc))}"
                          ) from None
    return plain


def output_error(schema: Mapping[str, Any], value: object) -> str | None:
    """Why ``value`` is not a result for ``schema`` (one line, bounded), or ``None`` when it
    is one. The schema must have passed :func:`check_output_schema`."""
    if not isinstance(value, Mapping):
        return f"the result must be a JSON object, got {_json_type(value)}"
    try:
        size = output_size(value)
    except CorruptRecord as exc:
        return str(exc)
    if size > MAX_OUTPUT_BYTES:
        return f"the result is {size} bytes as JSON; at most {MAX_OUTPUT_BYTES} are kept"
    from jsonschema.exceptions import best_match
    from jsonschema.validators import validator_for

    try:
        validator = validator_for(schema)(schema)
        error = best_match(validator.iter_errors(value))
    except Exception as exc:  # noqa: BLE001 - an unresolvable $ref, a bad pattern...
        return f"the output schema cannot be applied: {_short(str(exc))}"
    if error is None:
        return None
    where = "".join(f"/{p}" for p in error.absolute_path) or "/"
    return _short(f"at {where}: {error.message}")


def submit_instructions() -> str:
    """What an agent without native structured output is told after its prompt."""
    return (f"\n\nWhen you have the answer, call the tool `{SUBMIT_TOOL}` (MCP server "
            "`corral`) with your result as its arguments: a JSON object matching the tool's "
            "input schema. If it answers with an error, fix the result and call it again. "
            "Your final answer is what that tool accepts.")


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__


def _short(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MAX_ERROR_CHARS else line[:MAX_ERROR_CHARS - 1] + "…"


@dataclass(slots=True)
class OutputState:
    """A run's structured result: the value accepted by this driver, the answers that did
    not match (bounded by ``retries``; ``invalid`` starts at the count the run's earlier
    drivers stored, so a takeover continues it) and the last validation error."""

    schema: dict[str, Any]
    retries: int = DEFAULT_OUTPUT_RETRIES
    value: dict[str, Any] | None = None
    invalid: int = 0
    last_error: str | None = None
    on_valid: Callable[[dict[str, Any]], Awaitable[object]] | None = field(
        default=None, repr=False)
    """Called with each accepted result before the agent hears it was accepted (the
    Runner stores it on the run record)."""
    on_invalid: Callable[[int, str], Awaitable[object]] | None = field(
        default=None, repr=False)
    """Called with the new count and the error of each result that did not match, before
    the agent hears of it (the Runner stores both on the run record)."""

    async def reject(self, error: str) -> None:
        """Count one result that did not match (``error``: why)."""
        self.invalid += 1
        self.last_error = error
        if self.on_invalid is not None:
            await self.on_invalid(self.invalid, error)

    @property
    def exhausted(self) -> bool:
        """The agent gave ``retries + 1`` results that did not match: no more tries."""
        return self.invalid > self.retries

    async def offer(self, value: object) -> str | None:
        """Validate a result; keep it when it matches (``None``), else count it and return
        the validation error."""
        error = output_error(self.schema, value)
        if error is not None:
            await self.reject(error)
            return error
        assert isinstance(value, Mapping)
        accepted = dict(value)
        if self.on_valid is not None:
            await self.on_valid(accepted)
        self.value = accepted
        return None


@dataclass(frozen=True, slots=True)
class SubmitResultTool:
    """The host tool ``submit_result`` (:class:`corral.tools._core.ToolLike`): its input
    schema is the run's output schema; each call offers a result to ``state``."""

    state: OutputState
    name: str = SUBMIT_TOOL
    approval: bool = False

    @property
    def description(self) -> str:
        return ("Give your final result: call this once you are done, with the result as "
                "the arguments (a JSON object matching this tool's input schema). A result "
                "that does not match is answered with the error; correct it and call again "
                f"(at most {self.state.retries} more times).")

    @property
    def input_schema(self) -> dict[str, Any]:
        return self.state.schema

    async def run(self, args: Any, context: ToolContext | None = None) -> Any:
        state = self.state
        if state.exhausted:
            raise ToolError(f"no more tries: {state.retries + 1} results did not match the "
                            f"schema (the last: {state.last_error}); the run fails")
        error = await state.offer(args if args is not None else {})
        if error is None:
            return "Result accepted. You are done: end your turn now."
        left = state.retries + 1 - state.invalid
        if left <= 0:
            raise ToolError(f"the result does not match the schema, {error}. No tries are "
                            "left: the run fails. End your turn.")
        raise ToolError(f"the result does not match the schema, {error}. Fix it and call "
                        f"{SUBMIT_TOOL} again ({left} {'try' if left == 1 else 'tries'} left).")
