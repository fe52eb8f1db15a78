"""The run spec: typed, versioned, harness options under their own key; records written
before it had a version are read by migration, newer ones refused in one line. The
plain-Python parser takes, converts and refuses every stored value as the pydantic model it
replaced did (that model is kept here as the oracle), and reading a spec loads no pydantic
(issue #17: ``corral attach``'s start-up)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, ValidationError

import corral
from corral._errors import ConfigError
from corral.harness._claude_code import ClaudeCodeHarness
from corral.harness._command import CommandHarness
from corral.journal._layout import JournalPaths
from corral.journal._sentinel import format_trailer, new_nonce
from corral.runs import Runner, RunRequest, RunSpec
from corral.runs._spec import SPEC_VERSION, check_harness, harness_for_record, run_spec_of
from corral.sandbox._definition import Sandbox
from corral.policy._policy import Policy
from corral.stores._memory import MemoryStore
from corral.stores._protocols import NewRun
from corral.stores._records import RunRecord, RunStatus

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=3),
    max_leaves=6,
)


def record(spec: Any, harness: str = "command") -> RunRecord:
    return RunRecord(run_id="run-1", thread_id="run-1", status=RunStatus.RUNNING,
                     started_at=0.0, updated_at=0.0, harness=harness, spec=spec)


def one_line_refusal(exc: BaseException) -> str:
    message = str(exc)
    assert message and "\n" not in message, message
    return message


def test_a_spec_is_written_with_its_version_and_options_apart() -> None:
    request = RunRequest(command=["echo", "hi"], options={"files": "mine", "agent": 7,
                                                          "sandbox": "x"})
    sandbox = request.definition()
    stored = RunSpec.of_request(request, sandbox, request.harness_choice(sandbox)).to_json()
    assert stored["version"] == SPEC_VERSION == 1
    assert stored["harness_options"] == {"files": "mine", "agent": 7, "sandbox": "x"}
    # the run's own fields are the run's, whatever the options are called
    assert "files" not in stored and "agent" not in stored
    assert stored["sandbox"] == sandbox.to_dict()
    assert stored["argv"] == ["echo", "hi"]
    assert json.loads(json.dumps(stored)) == stored


def test_options_named_like_the_runs_fields_no_longer_collide() -> None:
    spec = RunSpec(harness_options={"files": {"diff": True}, "agent": {"services_pid": 1}},
                   files={"diff": False, "baseline": "abc"}, agent={"services_pid": 42})
    back = RunSpec.parse(spec.to_json())
    assert back.files == {"diff": False, "baseline": "abc"}
    assert back.agent == {"services_pid": 42}
    assert back.harness_options == {"files": {"diff": True}, "agent": {"services_pid": 1}}
    # the agent's runtime is updated without touching an option of the same name
    assert back.with_agent(services_pid=43).harness_options["agent"] == {"services_pid": 1}


def test_a_v0_record_is_migrated_on_read() -> None:
    """A flat spec as corral wrote it before the version: options at the top level."""
    v0 = {"model": "sonnet", "version": "2.0.1", "argv": ["echo", "hi"],
          "sandbox": {"provider": "local"}, "secret_names": ["TOKEN"],
          "policy": {"default": "deny"}, "permission_prompt": True,
          "files": {"diff": True, "baseline": None}, "agent": {"services_pid": 9}}
    spec = run_spec_of(record(v0))
    # a string "version" is the agent CLI's version: a harness option, not the schema's
    assert spec.harness_options == {"model": "sonnet", "version": "2.0.1"}
    assert spec.argv == ["echo", "hi"] and spec.sandbox == {"provider": "local"}
    assert spec.secret_names == ["TOKEN"] and spec.permission_prompt is True
    assert spec.files == {"diff": True, "baseline": None}
    assert spec.agent == {"services_pid": 9}
    assert spec.harness_config() == {"model": "sonnet", "version": "2.0.1",
                                     "argv": ["echo", "hi"], "policy": {"default": "deny"},
                                     "permission_prompt": True}
    harness = harness_for_record(record({"argv": ["echo", "hi"]}))
    assert isinstance(harness, CommandHarness) and harness.argv == ["echo", "hi"]


def test_the_harness_is_rebuilt_from_a_v1_spec() -> None:
    sandbox = Sandbox(provider="local", policy=Policy(default="deny"))
    request = RunRequest(prompt="go", harness="claude-code", options={"version": "2.0.1"},
                         sandbox=sandbox)
    spec = RunSpec.of_request(request, sandbox, request.harness_choice(sandbox))
    assert spec.permission_prompt and spec.policy == sandbox.policy.to_dict()
    harness = harness_for_record(record(spec.to_json(), harness="claude-code"))
    assert isinstance(harness, ClaudeCodeHarness)
    assert harness.version == "2.0.1"  # the option, not the schema version
    assert harness.policy_mapping.permission_prompt


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=6))
def test_v0_migration_keeps_every_option(options: dict[str, Any]) -> None:
    """Any flat v0 spec: the run's known fields are lifted out, every other key is kept
    as a harness option, and the migrated spec round-trips through v1."""
    options = {k: v for k, v in options.items()
               if k not in {f.name for f in dataclasses.fields(RunSpec)}}
    spec = RunSpec.parse({**options, "argv": ["true"]})
    assert spec.harness_options == options and spec.argv == ["true"]
    assert RunSpec.parse(spec.to_json()) == spec


@pytest.mark.parametrize("version", [2, 99])
def test_a_newer_spec_is_refused_in_one_line(version: int) -> None:
    with pytest.raises(ConfigError) as info:
        run_spec_of(record({"version": version, "harness_options": {}}))
    message = one_line_refusal(info.value)
    assert f"schema version {version}" in message and "run-1" in message
    assert f"versions 1 to {SPEC_VERSION}" in message


@pytest.mark.parametrize("spec", [
    {"version": 1, "harness_options": {}, "surprise": 1},
    {"version": 1, "argv": "echo hi"},
    {"version": True},
    {"version": 0},
])
def test_a_malformed_spec_is_refused_in_one_line(spec: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as info:
        run_spec_of(record(spec))
    assert "run-1" in one_line_refusal(info.value)


def test_a_run_recorded_with_a_v0_spec_is_driven_to_its_end() -> None:
    """A run started by an older corral (flat spec) is attached to and finished."""

    async def main(root: Path) -> RunRecord:
        store = MemoryStore()
        nonce = new_nonce()
        paths = JournalPaths.for_run(root, "old-run")
        paths.journal.write_bytes(b"hello" + format_trailer(nonce, 0, None))
        await store.create(NewRun(run_id="old-run", thread_id="old-run", harness="command",
                                  spec={"argv": ["echo", "hello"], "model": "x"},
                                  journal={"dir": str(root), "nonce": nonce}))
        result = await Runner(store, journals_dir=root).drive("old-run")
        text = "".join(e.event.get("delta", "") for e in await store.snapshot("old-run"))
        assert text == "hello"
        return result.record

    with tempfile.TemporaryDirectory() as tmp:
        final = anyio.run(main, Path(tmp))
    assert final.status is RunStatus.COMPLETED


def test_a_run_with_a_newer_spec_is_refused_not_misdriven() -> None:
    async def main(root: Path) -> None:
        store = MemoryStore()
        nonce = new_nonce()
        paths = JournalPaths.for_run(root, "new-run")
        paths.journal.write_bytes(b"hello" + format_trailer(nonce, 0, None))
        await store.create(NewRun(run_id="new-run", thread_id="new-run", harness="command",
                                  spec={"version": 2, "argv": ["echo"]},
                                  journal={"dir": str(root), "nonce": nonce}))
        with pytest.raises(ConfigError, match="schema version 2"):
            await Runner(store, journals_dir=root).drive("new-run")
        assert await store.snapshot("new-run") == []  # nothing was logged

    with tempfile.TemporaryDirectory() as tmp:
        anyio.run(main, Path(tmp))


# --- the parser against the pydantic model it replaced ---------------------------------

SRC = Path(corral.__file__).parent.parent


class OracleSpec(BaseModel):
    """The pydantic model ``RunSpec`` was until the spec became a dataclass (its fields
    and types, validated as it validated them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    harness_options: dict[str, Any] = {}
    argv: list[str] | None = None
    sandbox: dict[str, Any] | None = None
    secret_names: list[str] = []
    policy: dict[str, Any] | None = None
    permission_prompt: bool = False
    files: dict[str, Any] | None = None
    trace: dict[str, str] | None = None
    frontend_tools: list[dict[str, Any]] | None = None
    output_schema: dict[str, Any] | None = None
    agent: dict[str, Any] | None = None
    harness_package: dict[str, Any] | None = None


V0_FIELDS = {"sandbox", "secret_names", "argv", "policy", "permission_prompt", "files", "agent"}


def oracle(data: Mapping[str, Any] | None) -> tuple[str, Any]:
    """What the model made of a stored spec: ``("ok", fields)`` or ``("refused", where)``
    (the refusals of the version checks, which were plain Python, are the parser's own)."""
    if data is None:
        return "ok", OracleSpec().model_dump()
    version = data.get("version")
    if version is None or isinstance(version, str):
        fields = {k: v for k, v in data.items() if k in V0_FIELDS}
        if fields.get("secret_names") is None:
            fields.pop("secret_names", None)
        data = {**fields, "harness_options": {k: v for k, v in data.items()
                                              if k not in V0_FIELDS}}
    elif isinstance(version, bool) or not isinstance(version, int) or version != 1:
        return "refused", "version"
    try:
        return "ok", OracleSpec.model_validate(data).model_dump()
    except ValidationError as exc:
        return "refused", ".".join(str(p) for p in exc.errors()[0]["loc"])


def parsed(data: Any) -> tuple[str, Any]:
    try:
        return "ok", dataclasses.asdict(run_spec_of(record(data)))
    except ConfigError as exc:
        message = one_line_refusal(exc)
        assert message.startswith("run run-1: its spec ")
        where = message.split(" malformed at ", 1)[1].split(": ", 1)[0] if (
            " malformed at " in message) else "version"
        return "refused", where


json_leaves = (st.none() | st.booleans() | st.integers(-2, 2)
               | st.floats(allow_nan=False, width=16) | st.text(max_size=4))
any_json = st.recursive(
    json_leaves,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=3),
    max_leaves=6,
)
FIELDS = ("version", "harness_options", "argv", "sandbox", "secret_names", "policy",
          "permission_prompt", "files", "trace", "frontend_tools", "output_schema", "agent",
          "harness_package")
objects = st.dictionaries(st.text(max_size=4), any_json, max_size=3)
# Values of each field's right type and of wrong ones (some of which the model coerced:
# "yes", 1 and 1.0 for a bool; 1.0 for the version is refused).
good_values: dict[str, Any] = {
    "version": st.just(1),
    "harness_options": objects,
    "argv": st.none() | st.lists(st.text(max_size=4), max_size=3),
    "sandbox": st.none() | objects,
    "secret_names": st.lists(st.text(max_size=4), max_size=3),
    "policy": st.none() | objects,
    "permission_prompt": st.booleans() | st.sampled_from(
        [0, 1, 0.0, 1.0, "yes", "No", "OFF", "t", "F", "1", "0", "true", "y"]),
    "files": st.none() | objects,
    "trace": st.none() | st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2),
    "frontend_tools": st.none() | st.lists(objects, max_size=2),
    "output_schema": st.none() | objects,
    "agent": st.none() | objects,
    "harness_package": st.none() | objects,
}
odd_values = any_json | st.sampled_from(
    [1.0, 2, 0, -1, 0.5, "1", "yes", "off", "true ", "", True, [1], ["a", 1], {"a": 1},
     [{"a": 1}, 3], {"k": None}, ("a", "b")])


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    for name in draw(st.lists(st.sampled_from(FIELDS), unique=True)):
        wrong = draw(st.integers(0, 5)) == 0
        spec[name] = draw(odd_values if wrong else good_values[name])
    if draw(st.integers(0, 9)) == 0:
        spec[draw(st.text(min_size=1, max_size=4))] = draw(any_json)  # unknown field
    return spec


@settings(max_examples=500)
@given(specs())
def test_the_parser_takes_converts_and_refuses_as_the_model(spec: dict[str, Any]) -> None:
    assert parsed(spec) == oracle(spec)


@given(st.dictionaries(st.text(max_size=6), any_json, max_size=4))
def test_unversioned_and_arbitrary_specs_agree_with_the_model(spec: dict[str, Any]) -> None:
    assert parsed(spec) == oracle(spec)


@given(st.dictionaries(st.sampled_from(FIELDS), any_json | st.integers(), max_size=5))
def test_any_value_in_any_field_agrees_with_the_model(spec: dict[str, Any]) -> None:
    assert parsed(spec) == oracle(spec)


@pytest.mark.parametrize(("spec", "where"), [
    ({"version": 1, "argv": ["echo", 3]}, "argv.1"),          # a number in the command
    ({"version": 1, "secret_names": "TOKEN"}, "secret_names"),  # a string, not a list
    ({"version": 1, "bogus": True}, "bogus"),                  # an unknown field
    ({"version": 1, "bogus": True, "argv": 3}, "argv"),        # fields first, as the model
    ({"version": 1, "trace": {"traceparent": 5}}, "trace.traceparent"),
    ({"version": 1, "frontend_tools": [3]}, "frontend_tools.0"),
    ({"version": 1, "permission_prompt": "maybe"}, "permission_prompt"),
    ({"version": 1, "harness_options": None}, "harness_options"),
    ({"version": 1, "sandbox": {1: "a"}}, "sandbox.1.[key]"),   # not from JSON, but a key
    ({"argv": ["sh"], "secret_names": [1]}, "secret_names.0"),  # v0, migrated first
])
def test_a_bad_spec_is_refused_in_one_line_at_its_place(spec: dict[str, Any],
                                                        where: str) -> None:
    assert parsed(spec) == oracle(spec) == ("refused", where)


@pytest.mark.parametrize("spec", [None, {}, {"version": 1, "permission_prompt": "yes"},
                                  {"version": 1, "argv": ("a", "b")},
                                  {"argv": ["sh"], "custom": 1, "version": "2.1"},
                                  {"version": None, "argv": ["sh"]}])
def test_coerced_and_migrated_specs_read_as_the_model_read_them(spec: Any) -> None:
    assert parsed(spec) == oracle(spec)


def test_a_spec_that_is_no_object_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as info:
        run_spec_of(record(["argv"]))
    assert "run-1" in one_line_refusal(info.value)


def test_the_spec_is_frozen_and_owns_its_containers() -> None:
    stored = {"version": 1, "sandbox": {"provider": "local"}, "argv": ["a"]}
    spec = run_spec_of(record(stored))
    with pytest.raises(AttributeError):
        spec.argv = ["b"]  # type: ignore[misc]
    assert spec.sandbox is not None and spec.argv is not None
    spec.sandbox["provider"] = "changed"
    spec.argv.append("b")
    assert stored == {"version": 1, "sandbox": {"provider": "local"}, "argv": ["a"]}
    out = spec.to_json()
    out["sandbox"]["provider"] = "again"
    assert spec.sandbox == {"provider": "changed"}


def test_the_spec_pickles_and_says_its_public_namespace() -> None:
    import pickle

    spec = RunSpec(argv=["a"], agent={"services_pid": 3})
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert RunSpec.__module__ == "corral.runs"


def test_reading_a_spec_and_rebuilding_its_harness_loads_no_pydantic() -> None:
    request = RunRequest(command=["echo", "hi"])
    sandbox = request.definition()
    stored = RunSpec.of_request(request, sandbox, request.harness_choice(sandbox)).to_json()
    code = (
        "import json, sys\n"
        "from corral.runs._spec import check_harness, harness_for_record, run_spec_of\n"
        "from corral.stores._records import RunRecord, RunStatus\n"
        "for spec in json.loads(sys.argv[1]):\n"
        "    rec = RunRecord(run_id='r', thread_id='r', status=RunStatus.RUNNING,"
        " started_at=0.0, updated_at=0.0, harness='command', spec=spec)\n"
        "    run_spec_of(rec); check_harness(rec); harness_for_record(rec)\n"
        "print('pydantic' in sys.modules)\n"
    )
    # corral's own v1 spec, a v0 spec and one the parser converts: none takes pydantic
    odd = {**stored, "permission_prompt": "no"}
    out = subprocess.run([sys.executable, "-c", code, json.dumps([stored, {"argv": ["x"]},
                                                                  odd])],
                         check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(SRC)})
    assert out.stdout.strip() == "False"
    check_harness(record(stored))
