"""The spec view drivers read (``corral.runs._specview``) takes, converts and refuses every
spec exactly as the pydantic model does (``run_spec_of``), and reads the canonical v1 spec
corral writes without loading pydantic (issue #17: ``corral attach``'s start-up)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import corral
from corral._errors import ConfigError
from corral.runs import RunRequest
from corral.runs._spec import harness_for_record as model_harness_for_record
from corral.runs._spec import run_spec_of
from corral.runs._specview import harness_for_record, spec_view
from corral.stores._records import RunRecord, RunStatus

SRC = Path(corral.__file__).parent.parent

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 2) | st.floats(allow_nan=False, width=16)
    | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=3),
    max_leaves=6,
)
FIELDS = ("version", "harness_options", "argv", "sandbox", "secret_names", "policy",
          "permission_prompt", "files", "trace", "frontend_tools", "agent", "harness_package")
# Values of each field's right type and of wrong ones (some of which pydantic coerces:
# "yes" and 1 for a bool, 1.0 for the version).
good_values: dict[str, Any] = {
    "version": st.just(1),
    "harness_options": st.dictionaries(st.text(max_size=4), json_values, max_size=3),
    "argv": st.none() | st.lists(st.text(max_size=4), max_size=3),
    "sandbox": st.none() | st.dictionaries(st.text(max_size=4), json_values, max_size=3),
    "secret_names": st.lists(st.text(max_size=4), max_size=3),
    "policy": st.none() | st.dictionaries(st.text(max_size=4), json_values, max_size=2),
    "permission_prompt": st.booleans(),
    "files": st.none() | st.dictionaries(st.text(max_size=4), json_values, max_size=2),
    "trace": st.none() | st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2),
    "frontend_tools": st.none() | st.lists(
        st.dictionaries(st.text(max_size=4), json_values, max_size=2), max_size=2),
    "agent": st.none() | st.dictionaries(st.text(max_size=4), json_values, max_size=3),
    "harness_package": st.none() | st.dictionaries(st.text(max_size=4), json_values,
                                                   max_size=3),
}
odd_values = json_values | st.sampled_from([1.0, 2, 0, "1", "yes", "off", True, [1], {"a": 1}])


def record(spec: Any, harness: str = "command") -> RunRecord:
    return RunRecord(run_id="run-1", thread_id="run-1", status=RunStatus.RUNNING,
                     started_at=0.0, updated_at=0.0, harness=harness, spec=spec)


def outcome(fn: Any, rec: RunRecord) -> tuple[str, Any]:
    try:
        return "ok", fn(rec)
    except ConfigError as exc:
        return "refused", str(exc)


def assert_same(spec: Any) -> None:
    rec = record(spec)
    model = outcome(lambda r: run_spec_of(r).model_dump(), rec)
    view = outcome(lambda r: spec_view(r).as_dict(), rec)
    assert view == model


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    for name in draw(st.lists(st.sampled_from(FIELDS), unique=True)):
        wrong = draw(st.integers(0, 5)) == 0
        spec[name] = draw(odd_values if wrong else good_values[name])
    if draw(st.integers(0, 9)) == 0:
        spec[draw(st.text(min_size=1, max_size=4))] = draw(json_values)  # unknown field
    return spec


@settings(max_examples=400)
@given(specs())
def test_the_view_takes_converts_and_refuses_as_the_model(spec: dict[str, Any]) -> None:
    assert_same(spec)


@given(st.dictionaries(st.text(max_size=6), json_values, max_size=4))
def test_unversioned_and_arbitrary_specs_agree_with_the_model(spec: dict[str, Any]) -> None:
    assert_same(spec)


@pytest.mark.parametrize("spec", [
    {"version": 1, "argv": ["echo", 3]},          # a number in the command
    {"version": 1, "secret_names": "TOKEN"},      # a string, not a list
    {"version": 1, "bogus": True},                # an unknown field
    {"version": 2},                               # newer than this corral
    {"version": True},                            # a malformed version
    {"version": 1, "trace": {"traceparent": 5}},
    {"version": 1, "frontend_tools": [3]},
])
def test_a_bad_spec_is_refused_in_the_same_line(spec: dict[str, Any]) -> None:
    kind, message = outcome(lambda r: spec_view(r), record(spec))
    assert kind == "refused" and "\n" not in message and "run-1" in message
    assert (kind, message) == outcome(lambda r: run_spec_of(r), record(spec))


@pytest.mark.parametrize("spec", [None, {}, {"version": 1, "permission_prompt": "yes"},
                                  {"argv": ["sh"], "custom": 1, "version": "2.1"}])
def test_coerced_and_migrated_specs_read_as_the_model_reads_them(spec: Any) -> None:
    assert_same(spec)


def test_the_harness_is_rebuilt_as_from_the_model() -> None:
    request = RunRequest(command=["echo", "hi"], options={"cwd": "/workspace"})
    stored = request.spec(request.definition()).to_json()
    a, b = harness_for_record(record(stored)), model_harness_for_record(record(stored))
    assert type(a) is type(b) and vars(a) == vars(b)


def test_the_view_is_read_only_and_owns_its_containers() -> None:
    stored = {"version": 1, "sandbox": {"provider": "local"}, "argv": ["a"]}
    view = spec_view(record(stored))
    with pytest.raises(AttributeError):
        view.argv = ["b"]  # type: ignore[misc]
    assert view.sandbox is not None
    view.sandbox["provider"] = "changed"
    assert stored["sandbox"] == {"provider": "local"}


def test_the_spec_corral_writes_is_read_without_pydantic() -> None:
    request = RunRequest(command=["echo", "hi"])
    stored = request.spec(request.definition()).to_json()
    code = (
        "import json, sys\n"
        "from corral.runs._specview import harness_for_record, spec_view\n"
        "from corral.stores._records import RunRecord, RunStatus\n"
        "rec = RunRecord(run_id='r', thread_id='r', status=RunStatus.RUNNING, started_at=0.0,"
        " updated_at=0.0, harness='command', spec=json.loads(sys.argv[1]))\n"
        "spec_view(rec); harness_for_record(rec)\n"
        "print('pydantic' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, json.dumps(stored)], check=True,
                         capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(SRC)})
    assert out.stdout.strip() == "False"
