"""The run spec: typed, versioned, harness options under their own key; records written
before it had a version are read by migration, newer ones refused in one line."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral._errors import ConfigError
from corral.harness._claude_code import ClaudeCodeHarness
from corral.harness._command import CommandHarness
from corral.journal._layout import JournalPaths
from corral.journal._sentinel import format_trailer, new_nonce
from corral.runs import Runner, RunRequest, RunSpec
from corral.runs._spec import SPEC_VERSION, harness_for_record, run_spec_of
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


def record(spec: dict[str, Any] | None, harness: str = "command") -> RunRecord:
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
    stored = request.spec(sandbox).to_json()
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
    request = RunRequest(prompt="go", harness="claude-code", options={"version": "2.0.1"})
    spec = request.spec(sandbox)
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
               if k not in RunSpec.model_fields and k != "version"}
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
