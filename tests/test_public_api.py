"""The public face: ``corral`` exports exactly the names pinned here, each resolves, and each
class and function says it lives in the public-most namespace that exports it (``corral``
over ``corral.sandbox`` over a private module). Namespaces stay lazy."""

from __future__ import annotations

import importlib
import json
import os
import pickle
import subprocess
import sys
import types
from pathlib import Path

import pytest

import corral

PINNED = [
    "Capabilities", "ConfigError", "CorralError", "Decision", "ExecResult", "FileEvent",
    "Files", "GitSource", "Hooks", "Lifecycle", "LocalDir", "LoggedEvent",
    "NoSource", "Parallel", "Policy", "PrerequisiteMissing",
    "ReapOutcome", "ReapResult", "Redactor", "ResourceLimits", "RunContext", "RunExists",
    "RunRecord", "RunRequest", "RunStartError", "RunStatus", "Runner", "Sandbox",
    "SandboxReclaimFailedError", "SandboxRef", "SandboxSpec", "SecretRef", "Secrets", "Step",
    "StoreError", "ThreadBusy", "ThreadError", "Threads", "Toolset", "UnknownRun", "UnknownThread", "UnsupportedCapability", "Workspace", "__version__",
    "ProviderConfig", "dump_config", "load_config", "open_store", "parallel", "reap_detached_runs",
    "reclaim_sandbox", "register_provider", "sandbox_reclaimer", "tool",
]  # fmt: skip

# What an implementer of a seam needs, and nothing else: protocols live here only.
ABC = [
    "ApprovalGate", "ApprovalStore", "CheckpointStore", "ClaimStore", "DefaultLimits",
    "Described", "Diagnosable", "EventLog", "FileSystem", "Handle", "Harness", "HostPaths",
    "InsideSupervisor", "InstanceStore", "ListsLabelled", "LockStore", "LocksReadingInstance",
    "NeedsAgentRuntime", "Process", "ProcessApi", "Provider", "ProvidesSnapshots",
    "PrunesOrphans", "RunStore", "SandboxDirs", "SandboxIds", "SecretStore", "SessionStore",
    "Snapshotter", "Store", "ThreadStore", "ToolLike", "Translator", "UpsertsUnlocking",
]  # fmt: skip

# Protocols other namespaces exported before they lived in corral.abc only: the old names
# still resolve (to the same object, with a DeprecationWarning) but are listed nowhere.
MOVED = {
    "corral": ["Handle", "Process", "Provider"],
    "corral.sandbox": ["FileSystem", "Handle", "Process", "ProcessApi", "Provider"],
    "corral.stores": ["ApprovalStore", "CheckpointStore", "ClaimStore", "Diagnosable",
                      "EventLog", "InstanceStore", "LockStore", "RunStore", "SecretStore",
                      "SessionStore", "Store"],
    "corral.harness": ["Harness", "Translator"],
    "corral.tools": ["ToolLike"],
}

# Protocols under src/corral that are not a seam a third party implements: each narrows a
# corral type to what one function uses, or is a private helper's.
INTERNAL_PROTOCOLS = {
    "ApprovalChannel": "the part of a Store approvals use (ApprovalStore + SecretStore)",
    "AgentSite": "where a run's supervisor lives: corral's own two sites, chosen by a provider's capabilities",
    "ConfigModel": "the part of a harness configuration class the harness registry uses",
    "Collectable": "what run-to-completion drives: a launched process or an agent's command",
    "Destroys": "what destroying needs of a provider (gc, reclaim)",
    "PipeStore": "the part of a Store the pipe uses",
    "PolicyLike": "the part of corral's Policy a harness maps",
    "ReapStore": "the part of a Store the reaper uses",
    "ReclaimProvider": "the part of a Provider reclaim uses",
    "RecordReader": "the part of a Store pruning uses",
    "TailReader": "the part of a Store quiescing uses",
    "ToolExecutor": "the transport behind corral's own remote tool stub",
    "_HasSecretValues": "private to the redactor",
}

NAMESPACES = [
    "corral", "corral.abc", "corral.agents", "corral.harness", "corral.journal", "corral.net",
    "corral.policy", "corral.providers", "corral.runs", "corral.sandbox", "corral.server",
    "corral.stores", "corral.testing", "corral.tools",
]  # fmt: skip



def _public(module: str) -> bool:
    return not any(part.startswith("_") for part in module.split("."))


def test_corral_exports_exactly_the_pinned_names() -> None:
    assert sorted(corral.__all__) == sorted(PINNED)
    assert set(dir(corral)) >= set(PINNED)


@pytest.mark.parametrize("name", [n for n in PINNED if n != "__version__"])
def test_each_name_resolves_and_says_corral(name: str) -> None:
    value = getattr(corral, name)
    if isinstance(value, (type, types.FunctionType)):
        assert value.__module__ == "corral", value


@pytest.mark.parametrize("package", NAMESPACES)
def test_every_namespace_resolves_to_public_modules(package: str) -> None:
    module = importlib.import_module(package)
    names = [n for n in module.__all__ if n != "__version__"]
    assert names == sorted(set(names), key=names.index), "duplicates in __all__"
    for name in names:
        value = getattr(module, name)
        if isinstance(value, (type, types.FunctionType)):
            assert _public(value.__module__), f"{package}.{name}: {value.__module__}"
            # the namespace the object names really has it (pickle, docs and reprs rely on it)
            assert getattr(importlib.import_module(value.__module__), name) is value


def test_abc_exports_exactly_the_pinned_protocols() -> None:
    import corral.abc

    assert sorted(corral.abc.__all__) == sorted(ABC)
    for name in ABC:
        value = getattr(corral.abc, name)
        assert getattr(value, "_is_protocol", False), f"corral.abc.{name} is not a protocol"


@pytest.mark.parametrize("package", [n for n in NAMESPACES if n != "corral.abc"])
def test_no_other_namespace_exports_a_protocol(package: str) -> None:
    module = importlib.import_module(package)
    protocols = [n for n in module.__all__
                 if getattr(getattr(module, n), "_is_protocol", False)]
    assert protocols == [], f"{package} exports protocols; they belong in corral.abc"


def test_every_protocol_is_in_abc_or_said_to_be_internal() -> None:
    # A new protocol is a decision: a seam third parties implement (corral.abc) or a
    # narrowing for one caller (INTERNAL_PROTOCOLS, with the reason).
    import ast

    import corral.abc

    found: set[str] = set()
    for path in Path(corral.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    ast.unparse(b).split("[")[0].endswith("Protocol") and
                    ast.unparse(b).split("[")[0] in ("Protocol", "typing.Protocol")
                    for b in node.bases):
                found.add(node.name)
    assert found - set(corral.abc.__all__) - set(INTERNAL_PROTOCOLS) == set()
    assert set(INTERNAL_PROTOCOLS) <= found, "INTERNAL_PROTOCOLS names a protocol that is gone"


@pytest.mark.parametrize(("package", "name"),
                         [(p, n) for p, names in MOVED.items() for n in names])
def test_a_moved_protocol_still_resolves_with_a_warning(package: str, name: str) -> None:
    import corral.abc

    module = importlib.import_module(package)
    assert name not in module.__all__ and name not in dir(module)
    with pytest.warns(DeprecationWarning, match=f"corral.abc.{name}") as caught:
        value = getattr(module, name)
    assert value is getattr(corral.abc, name)
    assert caught[0].filename == __file__  # it points at the code that used the old name


def test_the_first_line_a_user_writes_works() -> None:
    from corral import Policy, RunRequest, Runner, Sandbox, Workspace, open_store

    assert Runner.__module__ == RunRequest.__module__ == open_store.__module__ == "corral"
    assert repr(Sandbox).startswith("<class 'corral.Sandbox'")
    assert Workspace().setup == () and Policy().network == "deny"


def test_exported_objects_pickle_through_the_public_name() -> None:
    # a class pickles by reference: module and name, which must import back
    assert b"sandbox" not in pickle.dumps(corral.Policy)
    assert pickle.loads(pickle.dumps(corral.Policy)) is corral.Policy
    policy = corral.Policy(allow=("ls",))
    assert pickle.loads(pickle.dumps(policy)) == policy
    assert pickle.loads(pickle.dumps(corral.RunStatus.RUNNING)) is corral.RunStatus.RUNNING


def _fresh(code: str) -> object:
    env = {**os.environ, "PYTHONPATH": str(Path(corral.__file__).parent.parent)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_public_most_name_wins_whatever_is_touched_first() -> None:
    got = _fresh(
        "import json, corral.sandbox, corral.tools\n"
        "print(json.dumps([corral.sandbox.Sandbox.__module__, corral.tools.tool.__module__,"
        " corral.sandbox.GitError.__module__]))"
    )
    assert got == ["corral", "corral", "corral.sandbox"]


def test_namespaces_stay_lazy() -> None:
    # The journal supervisor is a fresh interpreter per run: importing it must not pull in
    # the rest of corral through the package namespaces.
    loaded = _fresh(
        "import json, sys, corral, corral.journal._supervisor\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('corral'))))"
    )
    heavy = {"corral.runs", "corral.sandbox", "corral.stores", "corral.server", "corral.tools"}
    assert isinstance(loaded, list) and loaded and not heavy & set(loaded), loaded
