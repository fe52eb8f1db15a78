"""What the harness conformance kit (:mod:`corral.testing._harness`) runs each check in.

:class:`HarnessCase` is what a harness's author supplies: its name, its options, which
command-policy features it enforces, and how the scripted model server talks to its CLI
where that differs between CLIs. :class:`HarnessWorld` is one check's private world built
around a case: a scripted model server on 127.0.0.1 standing in for every model API (with
a per-world "real" key), a private ``$CORRAL_HOME`` and bubblewrap files root, and ``corral``
in subprocesses (the user's path) or a :class:`~corral.runs._runner.Runner` in this process
(for host tools, which live in the driving process).
"""

# The world makes small blocking file calls on purpose (temporary directories, the store's
# SQLite file read directly to see exactly what was logged).
# ruff: noqa: ASYNC230

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from corral.harness._base import RunContext, translate_run
from corral.harness._events import event_to_dict
from corral.harness._registry import build_harness
from corral.journal._layout import JournalPaths
from corral.providers import _diskquota as diskquota
from corral.providers import get_provider
from corral.runs._launch import with_prompt
from corral.runs._request import RunRequest
from corral.runs._spec import RunSpec
from corral.sandbox._contracts import DEFAULT_PROVIDER
from corral.policy._policy import Policy, Verdict
from corral.stores import open_store
from corral.stores._protocols import Store
from corral.testing._kit import Factory, opened
from corral.testing._model_script import ModelRequest, Reply, ToolCall
from corral.testing._model_server import ModelServer

__all__ = [
    "FEATURES",
    "HarnessCase",
    "HarnessWorld",
    "HostToolCall",
    "host_tool_by_suffix",
    "normalized",
    "world",
]

FEATURES = ("deny", "ask")
"""Command-policy features a harness enforces or must refuse at definition time:
``deny`` (deny rules and ``default = "deny"``), ``ask`` (ask rules answered by a corral
approval)."""

HostToolCall = Callable[[ModelRequest, str, dict[str, Any]], ToolCall | None]


def host_tool_by_suffix(req: ModelRequest, tool: str, args: dict[str, Any]) -> ToolCall | None:
    """The model's call of host tool ``tool`` under the name the CLI offers it by: a Codex
    style Responses namespace ``mcp__corral``, else the first offered tool whose name ends
    with ``tool`` (``mcp__corral__tool``, ``corral_tool``, ``mcp_corral_tool`` …); ``None``
    when it is not on offer."""
    if tool in req.namespaced_tools.get("mcp__corral", []):
        return ToolCall("", tool=tool, namespace="mcp__corral", args=args)
    offered = [t for t in req.tools if t.endswith(tool) and "corral" in t]
    return ToolCall("", tool=offered[0], args=args) if offered else None


@dataclass(frozen=True)
class HarnessCase:
    """One harness under test, as its author describes it to the kit.

    ``harness`` and ``options`` are what a :class:`~corral.runs._request.RunRequest` takes
    (``harness="acp", options={"agent": "gemini"}``); ``run_args`` the same for ``corral
    run`` (default: ``--model``/``--agent`` from ``options``).
    """

    harness: str
    options: Mapping[str, Any] = field(default_factory=dict)
    run_args: Sequence[str] | None = None
    enforces: frozenset[str] = frozenset(FEATURES)
    """The :data:`FEATURES` the harness enforces; every other one must be refused at
    definition time (``corral run`` exits 2 with one line naming it, before any model
    call) — never silently dropped."""
    side_reply: Callable[[ModelRequest], Reply | None] | None = None
    """An answer for the CLI's requests that are not a turn of the conversation (opencode's
    tool-less title request), or ``None`` for a real turn."""
    host_tool_call: HostToolCall = host_tool_by_suffix
    """How the model calls a host tool by the name this CLI offers it under."""
    normalize: Callable[[str], str] | None = None
    """Blanks this CLI's own per-session values in one JSON-encoded event (ids the kit's
    comparison of a killed run with an uninterrupted one does not know of); ``""`` leaves
    the event out of that comparison (a notification the CLI sends on its own schedule,
    which may or may not come before the run ends)."""
    checks_tool_args: bool = False
    """The CLI checks a tool call's arguments against the tool's input schema itself and
    answers the model with its own error (gemini, also over ACP): an invalid structured
    result never reaches corral (``--harness gemini-cli`` is known to without it)."""
    provider: str = "bubblewrap"
    """The sandbox provider (``--provider``); the checks are verified with bubblewrap."""
    agents_dir: str | None = None
    """``$CORRAL_AGENTS_DIR`` where the CLI is installed (``None``: the environment's)."""
    deadline: float = 150.0
    """Seconds one agent run may take in a check."""
    extra_ask: tuple[str, ...] = ()
    """Ask rules added to the policy of every run of every check (runs without a policy
    get ``default = "allow"`` with them): a pattern no command of the checks matches puts
    a harness that enforces ask rules another way through every check in that mode
    (``opencode``, which then runs as ``opencode acp``)."""

    def corral_run_args(self) -> list[str]:
        if self.run_args is not None:
            return list(self.run_args)
        out: list[str] = [] if self.provider == DEFAULT_PROVIDER else ["--provider", self.provider]
        for key, flag in (("model", "--model"), ("agent", "--agent")):
            if self.options.get(key) is not None:
                out += [flag, str(self.options[key])]
        return out

    def scripted(self, script: Callable[[ModelRequest], Reply]) -> Callable[[ModelRequest],
                                                                              Reply]:
        """``script`` behind :attr:`side_reply`."""
        side = self.side_reply

        def answer(req: ModelRequest) -> Reply:
            if side is not None:
                reply = side(req)
                if reply is not None:
                    return reply
            return script(req)

        return answer


@dataclass
class HarnessWorld:
    """One check's world (see the module docstring). ``key`` is the "real" model key: the
    host's upstream variables hold it; nothing in a sandbox may."""

    case: HarnessCase
    server: ModelServer
    home: Path
    files: Path
    scratch: Path
    key: str
    env: dict[str, str]
    """The environment of ``corral`` subprocesses."""

    @property
    def db(self) -> Path:
        return self.home / "corral.db"

    @property
    def key_pattern(self) -> str:
        """A grep pattern matching :attr:`key` without containing it."""
        return f"{self.key[:-1]}[{self.key[-1]}]"

    def script(self, script: Callable[[ModelRequest], Reply]) -> None:
        """Answer the model requests with ``script`` (behind the case's side replies)."""
        self.server.script = self.case.scripted(script)

    # ------------------------------------------------------------ corral subprocesses

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-m", "corral"]

    def corral(self, *args: str, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        """``corral ARGS`` (blocking)."""
        return subprocess.run([*self.command, *args], env=self.env, capture_output=True,
                              text=True, timeout=timeout or self.case.deadline + 30,
                              check=False)

    async def acorral(self, *args: str, timeout: float | None = None
                      ) -> subprocess.CompletedProcess[str]:
        """``corral ARGS`` in a worker thread."""
        return await anyio.to_thread.run_sync(lambda: self.corral(*args, timeout=timeout))

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([*self.command, *args], env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def run_args(self, run_id: str, *extra: str) -> list[str]:
        """``run --harness H <case args> --run-id R --json EXTRA`` (the prompt goes last).
        A ``--workspace`` of :meth:`workspace` with a ``corral.toml`` also gets ``--config``
        (the kit trusts its own file: a repository's may only make the policy stricter)."""
        config: list[str] = []
        if self.case.extra_ask and "--workspace" not in extra:
            extra = (*extra, "--workspace", str(self.workspace(f"ask-{run_id}")))
        if "--workspace" in extra:
            toml = Path(extra[extra.index("--workspace") + 1]) / "corral.toml"
            if toml.is_file() and toml.parent.parent == self.scratch:
                config = ["--config", str(toml)]
        return ["run", "--harness", self.case.harness, *self.case.corral_run_args(),
                "--run-id", run_id, "--json", *config, *extra]

    async def agent(self, run_id: str, prompt: str, *extra: str
                    ) -> subprocess.CompletedProcess[str]:
        """``corral run`` of the case's harness to its end."""
        return await self.acorral(*self.run_args(run_id, *extra), prompt)

    def workspace(self, name: str, files: Mapping[str, str] | None = None,
                  toml: str | None = None) -> Path:
        """A host directory to copy into a run's sandbox (``--workspace``), with ``files``
        and, given ``toml`` (the body after ``id``), a ``corral.toml``."""
        ws = self.scratch / name
        ws.mkdir(parents=True)
        for rel, text in (files or {}).items():
            (ws / rel).write_text(text)
        toml = self.with_extra_ask(toml)
        if toml is not None:
            (ws / "corral.toml").write_text(f'id = "{name}"\n{toml}')
        return ws

    def with_extra_ask(self, toml: str | None) -> str | None:
        """``toml`` (a ``corral.toml`` body) with the case's :attr:`~HarnessCase.extra_ask`
        rules in its policy (a policy that has ask rules of its own is kept as it is)."""
        ask = self.case.extra_ask
        if not ask:
            return toml
        rules = f"ask = {json.dumps(list(ask))}\n"
        if toml is None or "[policy]" not in toml:
            return (toml or "") + f'\n[policy]\ndefault = "allow"\n{rules}'
        if re.search(r"(?m)^ask\s*=", toml):
            return toml
        return toml.replace("[policy]\n", f"[policy]\n{rules}", 1)

    def policy(self, default: Verdict = "allow") -> Policy:
        """A :class:`~corral.policy._policy.Policy` with ``default`` and the case's
        :attr:`~HarnessCase.extra_ask` rules (for checks that build a sandbox)."""
        return Policy(default=default, ask=self.case.extra_ask)

    # ------------------------------------------------------------ what was recorded

    def record(self, run_id: str) -> dict[str, Any]:
        """The run's record as stored (the SQLite document)."""
        with sqlite3.connect(self.db) as conn:
            row = conn.execute("SELECT doc FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        assert row is not None, f"no run {run_id} in the store"
        data: dict[str, Any] = json.loads(row[0])
        return data

    def log(self, run_id: str) -> list[dict[str, Any]]:
        """The run's event log; its offsets must be gap-free."""
        with sqlite3.connect(self.db) as conn:
            rows = conn.execute("SELECT offset, event FROM events WHERE run_id = ? "
                                "ORDER BY offset", (run_id,)).fetchall()
        assert [r[0] for r in rows] == list(range(1, len(rows) + 1)), \
            "log offsets must be gap-free"
        return [json.loads(r[1]) for r in rows]

    @asynccontextmanager
    async def store(self) -> AsyncIterator[Store]:
        """The world's store, opened in this process."""
        store = await open_store(f"sqlite://{self.db}")
        try:
            yield store
        finally:
            await store.aclose()

    async def retranslated(self, run_id: str, prompt: str) -> list[dict[str, Any]]:
        """The run's whole journal translated afresh in one go, after the start batch its
        first driver logs: what an uninterrupted driver would have logged."""
        rec = self.record(run_id)
        paths = JournalPaths.for_run(rec["journal"]["dir"], run_id)
        harness = build_harness(rec["harness"], RunSpec.parse(rec["spec"]).harness_config())
        out: list[Any] = []
        resumed = (rec["spec"].get("agent") or {}).get("resumed_session")
        ctx = RunContext(run_id, rec["thread_id"], resumed_session=resumed)
        async for batch in translate_run(harness, ctx, paths,
                                         nonce=rec["journal"]["nonce"]):
            out += batch.events
        request = RunRequest(prompt=prompt, harness=rec["harness"])
        return [event_to_dict(e) for e in with_prompt(out, request)]

    def normalized(self, events: list[dict[str, Any]], run_id: str) -> list[str]:
        """:func:`normalized` with the case's own :attr:`~HarnessCase.normalize`."""
        return normalized(events, run_id, self.case.normalize)


_VOLATILE = {"sessionId", "session_id", "duration_ms", "duration_api_ms", "total_cost_usd",
             "uuid", "timestamp", "durationMs", "durationApiMs"}


def _blank(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: ("*" if k in _VOLATILE else _blank(x)) for k, x in v.items()}
    if isinstance(v, list):
        return [_blank(x) for x in v]
    return v


def normalized(events: list[dict[str, Any]], run_id: str,
               extra: Callable[[str], str] | None = None) -> list[str]:
    """Events JSON-encoded with what differs between two runs of one script blanked: the
    run id, the CLI's per-session values (ids, timings, cost), the scripted server's
    numbering, and what ``extra`` (applied to each encoded event) blanks; an event
    ``extra`` maps to ``""`` is left out."""
    ids: dict[str, str] = {}

    def renumber(m: re.Match[str]) -> str:
        return ids.setdefault(m.group(0), f"{m.group(1)}#{len(ids)}")

    out = []
    for e in events:
        text = json.dumps(_blank(e), sort_keys=True).replace(run_id, "RUN")
        # the server numbers its message and tool ids over its lifetime; gemini-cli's
        # tool ids carry a timestamp, shell results a process group id; opencode's
        # part, session and message ids are its own
        text = re.sub(r"(msg_corral|toolu_corral|call_corral|resp_corral|"
                      r"run_shell_command_)\w+", renumber, text)
        text = re.sub(r"PGID: \d+", "PGID: *", text)
        # codex's exec output: a chunk id of its own, the wall time
        text = re.sub(r"Chunk ID: \w+", "Chunk ID: *", text)
        text = re.sub(r"Wall time: [\d.]+ seconds", "Wall time: *", text)
        text = re.sub(r"\b(prt|ses|msg)_[A-Za-z0-9]+", r"\1_*", text)
        if extra is not None:
            text = extra(text)
            if not text:
                continue
        out.append(text)
    return out


def _upstream_env(srv: ModelServer, key: str) -> dict[str, str]:
    return {
        "ANTHROPIC_BASE_URL": srv.url, "ANTHROPIC_API_KEY": key,
        "OPENAI_BASE_URL": srv.openai_url, "OPENAI_API_KEY": key,
        "GOOGLE_GEMINI_BASE_URL": srv.gemini_url, "GEMINI_API_KEY": key,
    }


@contextmanager
def _environ(values: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set while the block runs (a Runner in this process
    reads its home, upstream and agent installs from there)."""
    before = dict(os.environ)
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)


def _subprocess_pythonpath() -> str:
    return os.pathsep.join(p for p in sys.path if p)


async def _sandboxes_of(w: HarnessWorld, provider: str) -> set[str]:
    """The sandboxes of ``provider`` this world's store names (runs and instance records):
    only those. A provider's own listing is not the world's: a docker daemon lists every
    corral container on it, the user's included."""
    if not w.db.exists():
        return set()
    ids: set[str] = set()
    async with w.store() as store:
        for run in await store.list_runs(limit=10_000):
            ref = run.sandbox_ref or {}
            if ref.get("provider") == provider and isinstance(ref.get("id"), str):
                ids.add(ref["id"])
            if run.sandbox_key is not None:
                instance = await store.get_instance(run.sandbox_key)
                if instance is not None and instance.provider == provider:
                    ids.add(instance.provider_sandbox_id)
        for instance in await store.list_expired_instances(float("inf")):
            if instance.provider == provider:
                ids.add(instance.provider_sandbox_id)
    return ids


@asynccontextmanager
async def world(factory: Factory) -> AsyncIterator[HarnessWorld]:
    """The kit's subject: a fresh :class:`HarnessWorld` around the case ``factory`` makes;
    its sandboxes, model server and directories are gone afterwards."""
    async with opened(factory) as case:
        if not isinstance(case, HarnessCase):
            raise TypeError(f"the harness kit's factory must make a HarnessCase, not {case!r}")
        scratch = Path(tempfile.mkdtemp(prefix="corral-kit-"))
        # the sandbox's uid must traverse the files root (a private tmp dir is 0700)
        files = Path(tempfile.mkdtemp(prefix="corral-kit-bw-", dir="/var/tmp"))
        files.chmod(0o755)
        home = scratch / "home"
        home.mkdir()
        key = "sk-corral-kit-" + secrets.token_hex(12)
        srv = ModelServer().start()
        values = {"CORRAL_HOME": str(home), "CORRAL_BWRAP_FILES": str(files),
                  "CORRAL_LEASE_TTL": "3", **_upstream_env(srv, key)}
        if case.agents_dir is not None:
            values["CORRAL_AGENTS_DIR"] = case.agents_dir
        env = {**os.environ, **values, "PYTHONPATH": _subprocess_pythonpath()}
        env.pop("CORRAL_SECRET", None)  # corral's key comes from this world's store
        w = HarnessWorld(case, srv, home, files, scratch, key, env)
        try:
            with _environ(values):
                try:
                    yield w
                finally:
                    provider = get_provider(case.provider)
                    owned = await _sandboxes_of(w, provider.name)
                    if provider.name == "bubblewrap":  # its files root is this world's own
                        owned |= {ref.id for ref in await provider.list()}
                    for sandbox_id in owned:
                        await provider.destroy(sandbox_id)
        finally:
            srv.stop()
            diskquota.release(files)
            shutil.rmtree(files, ignore_errors=True)
            shutil.rmtree(scratch, ignore_errors=True)
