"""Fixtures for agent-CLI tests: the real CLIs from npm (installed once into a cache), real
bubblewrap sandboxes, a scripted model server on 127.0.0.1, and a helper that runs one
agent turn end to end (prepare → supervised launch → translate_run over the real journal)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from ag_ui.core import BaseEvent, EventType

from corral.agents._prepare import FinishReport, PreparedAgent, prepare_agent, with_agent_binds
from corral.harness._base import AgentRequest, Batch, RunContext, translate_run
from corral.harness._claude_code import ClaudeCodeHarness
from corral.harness._cli_base import CliHarness
from corral.harness._codex import CodexHarness
from corral.harness._gemini_cli import GeminiCliHarness
from corral.agents._installs import InstalledAgent, install_agent
from corral.net._model_proxy import Upstream
from corral.providers._bubblewrap import BubblewrapHandle, BubblewrapProvider
from corral.journal._layout import JournalPaths
from corral.journal._sentinel import new_nonce
from corral.journal._supervisor import kill_supervised, launch_supervised_async
from corral.sandbox._contracts import SandboxSpec
from corral.testing._model_server import ModelServer
from corral.testing._plugin import require
from tests.conftest import bwrap_works

REAL_KEY = "sk-corral-REAL-7f3a9c2e-never-in-sandbox"
CLIS = ("claude-code", "codex", "gemini-cli")


def agent_cache() -> Path:
    raw = os.environ.get("CORRAL_AGENT_CACHE")
    return Path(raw).expanduser() if raw else Path.home() / ".cache" / "corral-agents"


@pytest.fixture(scope="session")
def agent_installs(request: pytest.FixtureRequest) -> dict[str, InstalledAgent]:
    """The pinned CLIs, installed once per cache (``$CORRAL_AGENT_CACHE``)."""
    require(request.config, shutil.which("npm") is not None, "npm (Node.js)",
            "apt-get install nodejs npm")
    root = agent_cache()
    root.mkdir(parents=True, exist_ok=True)
    return {name: install_agent(name, root=root) for name in CLIS}


@pytest.fixture
def agents_env(agent_installs: dict[str, InstalledAgent], corral_home: Path,
               monkeypatch: pytest.MonkeyPatch) -> Path:
    """``$CORRAL_AGENTS_DIR`` at the cache, a private ``$CORRAL_HOME``."""
    root = agent_cache()
    monkeypatch.setenv("CORRAL_AGENTS_DIR", str(root))
    return root


@pytest.fixture
def bwrap(request: pytest.FixtureRequest, agents_env: Path) -> BubblewrapProvider:
    require(request.config, bwrap_works(), "bubblewrap with user namespaces",
            "apt-get install bubblewrap")
    require(request.config, os.path.exists("/usr/bin/python3"), "/usr/bin/python3",
            "apt-get install python3 (the in-sandbox forwarder runs on it)")
    return BubblewrapProvider()


@pytest.fixture
def model_server() -> Iterator[ModelServer]:
    srv = ModelServer().start()
    yield srv
    srv.stop()


def make_harness(name: str, **kw: Any) -> CliHarness:
    kinds: dict[str, type[CliHarness]] = {"claude-code": ClaudeCodeHarness,
                                          "codex": CodexHarness,
                                          "gemini-cli": GeminiCliHarness}
    return kinds[name](**kw)


def upstream_env(srv: ModelServer) -> dict[str, str]:
    """The host's model upstream variables, every API at ``srv`` with the real key."""
    return {
        "ANTHROPIC_BASE_URL": srv.url,
        "ANTHROPIC_API_KEY": REAL_KEY,
        "OPENAI_BASE_URL": srv.openai_url,
        "OPENAI_API_KEY": REAL_KEY,
        "GOOGLE_GEMINI_BASE_URL": srv.gemini_url,
        "GEMINI_API_KEY": REAL_KEY,
    }


@pytest.fixture
def host_env(monkeypatch: pytest.MonkeyPatch, model_server: ModelServer,
             corral_home: Path) -> ModelServer:
    """The model server as the host's upstream for every model API (the Runner's model
    proxy uses it)."""
    for name, value in upstream_env(model_server).items():
        monkeypatch.setenv(name, value)
    return model_server


def agent_cli_env(cli_env: dict[str, str], bwfiles: Path, srv: ModelServer) -> dict[str, str]:
    """The environment of a ``corral`` CLI that runs real agent CLIs against ``srv`` (the
    real key on the host side only), with sandboxes under ``bwfiles``."""
    env = dict(cli_env)
    env.update({
        "CORRAL_AGENTS_DIR": str(agent_cache()),
        "CORRAL_BWRAP_FILES": str(bwfiles),
        "CORRAL_LEASE_TTL": "3",
        **upstream_env(srv),
    })
    return env


def upstream_for(harness: CliHarness, srv: ModelServer, key: str = REAL_KEY) -> Upstream:
    url = {"anthropic": srv.url, "gemini": srv.gemini_url}.get(harness.model_api,
                                                               srv.openai_url)
    return Upstream(harness.model_api, url, key)


def base_options(name: str) -> dict[str, Any]:
    # Retries off: a failing model must end the run at once. Codex's default model uses a
    # request shape (code-mode tools) the scripted server does not script.
    opts: dict[str, Any] = {"max_retries": 0}
    if name == "codex":
        opts["model"] = "gpt-fake"
    if name == "gemini-cli":  # a model of its own: no routing request first
        opts["model"] = "gemini-fake"
    return opts


@dataclass
class AgentRun:
    events: list[BaseEvent]
    batches: list[Batch]
    report: FinishReport
    paths: JournalPaths
    prepared: PreparedAgent
    elapsed: float
    stderr: str = ""
    first_event_at: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def of(self, kind: EventType) -> list[Any]:
        return [e for e in self.events if e.type == kind]

    @property
    def terminal(self) -> Any:
        return self.events[-1]

    def tool_results(self) -> list[str]:
        return [str(e.content) for e in self.of(EventType.TOOL_CALL_RESULT)]

    def texts(self) -> list[str]:
        return [e.delta for e in self.of(EventType.TEXT_MESSAGE_CONTENT)]


async def run_agent(
    harness: CliHarness,
    handle: BubblewrapHandle,
    prompt: str,
    srv: ModelServer,
    *,
    thread_id: str = "thread-1",
    run_id: str = "run-1",
    deadline: float = 120.0,
    options: dict[str, Any] | None = None,
    **prepare_kw: Any,
) -> AgentRun:
    """One agent turn through the real machinery, bounded by ``deadline`` seconds."""
    opts = base_options(harness.name)
    opts.update(options or {})
    prepare_kw.setdefault("upstream", upstream_for(harness, srv))
    prepare_kw.setdefault("timeout", deadline)
    t0 = time.monotonic()
    if "sessions" not in prepare_kw:
        # the thread's saved session lives in this test's default store, as a Runner's does
        from corral.stores import open_store

        store = await open_store()
        try:
            return await run_agent(harness, handle, prompt, srv, thread_id=thread_id,
                                   run_id=run_id, deadline=deadline, options=options,
                                   sessions=store, **prepare_kw)
        finally:
            await store.aclose()
    prepared = await prepare_agent(harness, handle, AgentRequest(prompt=prompt, options=opts),
                                   thread_id=thread_id, run_id=run_id, **prepare_kw)
    paths = JournalPaths.for_run(handle.private_dir, run_id)
    nonce = new_nonce()
    events: list[BaseEvent] = []
    batches: list[Batch] = []
    first: float | None = None
    try:
        async with prepared.services():
            await launch_supervised_async(prepared.agent_spec(), paths, nonce)
            with anyio.fail_after(deadline + 15):
                async for batch in translate_run(harness, RunContext(run_id, thread_id), paths,
                                                 nonce=nonce):
                    if first is None and batch.item is not None:
                        first = time.monotonic() - t0
                    batches.append(batch)
                    events.extend(batch.events)
    finally:
        await anyio.to_thread.run_sync(lambda: kill_supervised(paths, grace=1.0))
    elapsed = time.monotonic() - t0
    report = await prepared.finish(paths, nonce)
    stderr = paths.stderr.read_text(errors="replace") if paths.stderr.exists() else ""
    return AgentRun(events, batches, report, paths, prepared, elapsed, stderr, first)


@pytest.fixture
def sandbox_factory(bwrap: BubblewrapProvider) -> Iterator[Any]:
    """``await make()`` creates a bubblewrap sandbox with the agent binds; all are destroyed
    at the end."""
    made: list[BubblewrapHandle] = []

    async def make(spec: SandboxSpec | None = None) -> BubblewrapHandle:
        handle = await bwrap.create(with_agent_binds(spec or SandboxSpec()))
        made.append(handle)
        return handle

    yield make

    async def cleanup() -> None:
        for h in made:
            await bwrap.destroy(h.ref)

    anyio.run(cleanup)


def files_containing(root: Path, needle: bytes, skip: Sequence[Path] = ()) -> list[Path]:
    """Every regular file under ``root`` whose bytes contain ``needle``."""
    hits: list[Path] = []
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            p = Path(dirpath) / name
            if p.is_symlink() or not p.is_file() or any(p.is_relative_to(s) for s in skip):
                continue
            try:
                if needle in p.read_bytes():
                    hits.append(p)
            except OSError:
                continue
    return hits


def assert_key_outside(handle: BubblewrapHandle, run: AgentRun) -> None:
    """Nothing under the sandbox's writable areas, the socket directory it sees, or the
    run's journal holds :data:`REAL_KEY`."""
    assert files_containing(Path(handle.host_root), REAL_KEY.encode()) == []
    net_dir = next(h for h, i in handle.state.binds if i == "/run/corral")
    assert files_containing(Path(net_dir), REAL_KEY.encode()) == []
    assert REAL_KEY.encode() not in run.paths.journal.read_bytes()
