"""The instance key: SHA-256 over every input; never the thread alone."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from corral import GitSource, RunContext, Secrets, Workspace
from corral.sandbox._key import KeyInput, instance_key

names = st.text(min_size=1, max_size=12)


@st.composite
def key_args(draw: st.DrawFn) -> dict[str, object]:
    return {
        "definition_id": draw(names),
        "provider_name": draw(st.sampled_from(["local", "bubblewrap", "docker"])),
        "provider_fingerprint": draw(names),
        "workspace_hash": draw(names),
        "egress": draw(st.booleans()),
        "ctx": RunContext(draw(names), draw(names), draw(st.none() | names)),
        "reuse": draw(st.sampled_from(["thread", "run", "none"])),
    }


@settings(max_examples=300, deadline=None)
@given(key_args(), st.data())
def test_every_input_changes_the_key(args: dict[str, object], data: st.DataObject) -> None:
    key = instance_key(**args)  # type: ignore[arg-type]
    assert len(key) == 64 and int(key, 16) >= 0
    assert instance_key(**args) == key  # type: ignore[arg-type]
    field = data.draw(
        st.sampled_from(
            ["definition_id", "provider_name", "provider_fingerprint", "workspace_hash", "egress",
             "tenant", "thread_id"]
        )
    )  # fmt: skip
    changed = dict(args)
    ctx = args["ctx"]
    assert isinstance(ctx, RunContext)
    if field == "tenant":
        changed["ctx"] = dataclasses.replace(ctx, tenant=(ctx.tenant or "") + "x")
    elif field == "thread_id":
        changed["ctx"] = dataclasses.replace(ctx, thread_id=ctx.thread_id + "x")
    elif field == "egress":
        changed["egress"] = not args["egress"]
    elif field == "provider_name":
        changed["provider_name"] = str(args["provider_name"]) + "2"
    else:
        changed[field] = str(args[field]) + "x"
    assert instance_key(**changed) != key  # type: ignore[arg-type]


@settings(max_examples=100, deadline=None)
@given(key_args(), names)
def test_run_id_counts_only_when_runs_do_not_share(args: dict[str, object], other_run: str) -> None:
    ctx = args["ctx"]
    assert isinstance(ctx, RunContext)
    other = dict(args, ctx=dataclasses.replace(ctx, run_id=ctx.run_id + other_run))
    same = instance_key(**args) == instance_key(**other)  # type: ignore[arg-type]
    assert same == (args["reuse"] == "thread")


def test_key_is_never_the_thread_alone() -> None:
    ctx = RunContext("thread-1", "run-1")
    a = instance_key(
        definition_id="a", provider_name="local", provider_fingerprint="f", workspace_hash="w",
        egress=False, ctx=ctx, reuse="thread",
    )  # fmt: skip
    b = instance_key(
        definition_id="b", provider_name="local", provider_fingerprint="f", workspace_hash="w",
        egress=False, ctx=ctx, reuse="thread",
    )  # fmt: skip
    assert a != b
    canonical = KeyInput("a", "local", "f", "w", False, None, "thread-1", None).canonical()
    assert '"thread":"thread-1"' in canonical and '"definition":"a"' in canonical


def test_workspace_hash_ignores_secret_values_but_not_content() -> None:
    src = GitSource(url="file:///r.git", auth=Secrets(T="one-value-1").T)
    w1 = Workspace(source=src, secrets=Secrets(T="one-value-1"), setup=["make"])
    w2 = Workspace(source=src, secrets=Secrets(T="two-value-2"), setup=["make"])
    w3 = Workspace(source=src, secrets=Secrets(T="one-value-1"), setup=["make all"])
    assert w1.hash() == w2.hash()
    assert w1.hash() != w3.hash()
    assert "one-value-1" not in str(w1.to_dict())
