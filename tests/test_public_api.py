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
    "Files", "GitSource", "Handle", "Hooks", "Lifecycle", "LocalDir", "LoggedEvent",
    "NoSource", "Parallel", "Policy", "PrerequisiteMissing", "Process", "Provider",
    "ReapOutcome", "ReapResult", "Redactor", "ResourceLimits", "RunContext", "RunExists",
    "RunRecord", "RunRequest", "RunStartError", "RunStatus", "Runner", "Sandbox",
    "SandboxReclaimFailedError", "SandboxRef", "SandboxSpec", "SecretRef", "Secrets", "Step",
    "StoreError", "ThreadBusy", "ThreadError", "Threads", "Toolset", "UnknownRun", "UnknownThread", "UnsupportedCapability", "Workspace", "__version__",
    "ProviderConfig", "dump_config", "load_config", "open_store", "parallel", "reap_detached_runs",
    "reclaim_sandbox", "register_provider", "sandbox_reclaimer", "tool",
]  # fmt: skip

NAMESPACES = [
    "corral", "corral.abc", "corral.agents", "corral.harness", "corral.journal", "corral.net",
    "corral.providers", "corral.runs", "corral.sandbox", "corral.server", "corral.stores",
    "corral.testing", "corral.tools",
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
