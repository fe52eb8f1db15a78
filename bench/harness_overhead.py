"""Harness overhead: a scripted two-step agent run (shell tool call, then a final answer),
in a corral bubblewrap sandbox versus the same CLI run directly on the host against the same
scripted model server.

corral: ``prepare_agent`` (model proxy on a unix socket) → ``launch_supervised`` with the
sandbox's ``host_command`` (bwrap + in-sandbox forwarder) → ``translate_run`` over the
journal. The sandbox exists already (thread reuse); its creation is timed separately.
direct: the same CLI argv and flags, ``subprocess`` with stdout piped, a fresh HOME.

"first event" = first line of CLI output (direct) / first translated journal event after
RUN_STARTED (corral); "total" = process exit (direct) / the terminal event (corral). Besides
the difference of the medians, the paired overhead is the median over the runs of each
corral run minus the direct run just before it, and the corral phases say when
``prepare_agent``, the model proxy and ``launch_supervised`` were done.

``acp-opencode`` (``--harness acp --agent opencode``): direct = ``opencode acp`` on the host
driven by corral's ACP client (``corral._insandbox.acp_client``, no sandbox, supervisor,
proxy or translation); "first event" = the agent's first line (its ``initialize`` answer) /
the first translated event (the same answer).

Run (CLIs installed with ``corral agents install``; ``$CORRAL_AGENTS_DIR`` or the default):
    PYTHONPATH=src python bench/harness_overhead.py [--runs 10] [--cli claude-code codex
        gemini-cli opencode acp-opencode acp-claude acp-gemini]
        [--services inprocess|detached] [--direct-cgroup]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from collections.abc import Callable

import anyio

from corral._insandbox import acp_client
from corral.agents._prepare import prepare_agent, with_agent_binds
from corral.harness._acp import AcpHarness
from corral.harness._base import AgentRequest, RunContext, translate_run
from corral.harness._claude_code import ClaudeCodeHarness
from corral.harness._cli_base import CliHarness, CliOptions
from corral.harness._codex import CodexHarness
from corral.harness._gemini_cli import GeminiCliHarness
from corral.harness._opencode import OpencodeHarness
from corral.agents._installs import find_installed, install_agent
from corral.net._model_proxy import Upstream
from corral.providers._cgroups import CGROUP_ROOT
from corral.providers._bubblewrap import BubblewrapProvider
from corral.journal._layout import JournalPaths
from corral.journal._sentinel import new_nonce
from corral.journal._supervisor import launch_supervised_async
from corral.sandbox._contracts import SandboxSpec
from corral.testing._model_script import ModelRequest, shell_then_text
from corral.testing._model_server import ModelServer

PROMPT = "run the command"


def options(name: str) -> dict[str, object]:
    opts: dict[str, object] = {"max_retries": 0}
    if name == "codex":
        opts["model"] = "gpt-fake"
    if name == "gemini-cli":
        opts["model"] = "gemini-fake"
    return opts


def harness_for(name: str) -> CliHarness:
    if name == "acp-opencode":
        return AcpHarness(agent="opencode", model="anthropic/claude-fake")
    if name == "acp-claude":
        return AcpHarness(agent="claude", model="claude-fake")
    if name == "acp-gemini":
        return AcpHarness(agent="gemini", model="gemini-fake")
    if name == "opencode":
        return OpencodeHarness(model="anthropic/claude-fake")
    kinds: dict[str, type[CliHarness]] = {"claude-code": ClaudeCodeHarness,
                                          "codex": CodexHarness,
                                          "gemini-cli": GeminiCliHarness}
    return kinds[name]()


def base_url(h: CliHarness, srv: ModelServer) -> str:
    api = h.upstream_api()
    return {"anthropic": srv.url, "gemini": srv.gemini_url}.get(api, srv.openai_url)


def upstream(h: CliHarness, srv: ModelServer) -> Upstream:
    return Upstream(h.upstream_api(), base_url(h, srv), "bench-key")


def direct_cgroup() -> str | None:
    """A cpu cgroup beside the sandboxes' (under ``corral/``), or ``None`` without cgroup
    v1: the direct run placed there competes for the CPU as a sandbox does (all sandboxes
    of the host share the ``corral`` group's weight, while a host process competes alone;
    on a busy machine that alone slows a sandboxed CLI by seconds)."""
    parent = CGROUP_ROOT / "cpu" / "corral"
    if not (parent / "cgroup.procs").exists():
        return None
    path = parent / f"bench-direct-{os.getpid()}"
    path.mkdir(exist_ok=True)
    return str(path)


def joiner(cgroup: str | None) -> Callable[[], None] | None:
    """A ``preexec_fn`` moving the direct run into ``cgroup`` (``None``: stay)."""
    if cgroup is None:
        return None

    def join() -> None:
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))

    return join


def direct_acp_run(h: AcpHarness, srv: ModelServer, cgroup: str | None = None
                   ) -> tuple[float, float, float]:
    install = find_installed(h.package.name)
    assert install is not None
    base = base_url(h, srv).rstrip("/") + h.profile.base_url_suffix
    opts = CliOptions.parse({"api_key": "bench-key"})
    home = tempfile.mkdtemp(prefix="bench-home-", dir="/var/tmp")
    work = tempfile.mkdtemp(prefix="bench-ws-", dir="/var/tmp")
    binary = h.bin_under(str(install.path))
    env = {"PATH": "/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8",
           **h.profile.bin_env(binary), **h.profile.env(h.model, base, opts, h.acp_policy)}
    # the fresh home gets what a sandbox's does: the configuration and the seeded state
    for rel, data in {**h.seed_home_files(),
                      **h.profile.home_files(h.model, base, opts, h.acp_policy)}.items():
        os.makedirs(os.path.dirname(os.path.join(home, rel)), exist_ok=True)
        with open(os.path.join(home, rel), "wb") as f:
            f.write(data)
    config = {"argv": h.profile.argv(binary), "env": env, "cwd": work, "workdir": work,
              "prompt": PROMPT, "permission": None, "mode": h.profile.mode}
    try:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-I", "-S", acp_client.__file__],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, preexec_fn=joiner(cgroup))
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(acp_client.encode_header(config))
        proc.stdin.close()
        first = None
        for line in proc.stdout:
            if first is None and line.startswith(b'{"acp":"recv"'):
                first = time.perf_counter() - t0
        rc = proc.wait()
        total = time.perf_counter() - t0
        if rc != 0 or not os.path.exists(os.path.join(work, "out.txt")):
            raise SystemExit(f"direct {h.name} run failed (exit {rc})")
        return first or total, total, t0
    finally:
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def direct_run(h: CliHarness, srv: ModelServer, cgroup: str | None = None
               ) -> tuple[float, float, float]:
    """``(first event, total, start)``: seconds, and the start's ``perf_counter``."""
    if isinstance(h, AcpHarness):
        return direct_acp_run(h, srv, cgroup)
    install = find_installed(h.name)
    assert install is not None
    base = base_url(h, srv)
    if h.name == "opencode" and not base.rstrip("/").endswith("/v1"):
        base = base.rstrip("/") + "/v1"  # opencode's providers take the API's /v1 base
    opts = {**options(h.name), "bin": str(install.bin_path), "base_url": base,
            "api_key": "bench-key"}
    cmd = h.build_command(AgentRequest(prompt=PROMPT, options=opts))
    home = tempfile.mkdtemp(prefix="bench-home-", dir="/var/tmp")
    for rel, data in {**h.seed_home_files(),
                      **h.home_files(CliOptions.parse(opts))}.items():  # gemini's settings
        os.makedirs(os.path.dirname(os.path.join(home, rel)), exist_ok=True)
        with open(os.path.join(home, rel), "wb") as f:
            f.write(data)
    work = tempfile.mkdtemp(prefix="bench-ws-", dir="/var/tmp")
    env = {"PATH": "/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8", **cmd.env}
    try:
        t0 = time.perf_counter()
        proc = subprocess.Popen(list(cmd.argv), env=env, cwd=work, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                preexec_fn=joiner(cgroup))
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(cmd.stdin or b"")
        proc.stdin.close()
        first = None
        for _line in proc.stdout:
            if first is None:
                first = time.perf_counter() - t0
        rc = proc.wait()
        total = time.perf_counter() - t0
        if rc != 0 or not os.path.exists(os.path.join(work, "out.txt")):
            raise SystemExit(f"direct {h.name} run failed (exit {rc})")
        return first or total, total, t0
    finally:
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


async def corral_run(h: CliHarness, srv: ModelServer, provider: BubblewrapProvider, i: int,
                     detached: bool) -> tuple[float, float, float, dict[str, float], float]:
    """``(first event, total, sandbox create, phases, start)``: seconds, and the start's
    ``perf_counter``."""
    t_create = time.perf_counter()
    handle = await provider.create(with_agent_binds(SandboxSpec()))
    create = time.perf_counter() - t_create
    try:
        run_id = f"bench-{h.name}-{i}"
        t0 = time.perf_counter()
        prepared = await prepare_agent(h, handle, AgentRequest(prompt=PROMPT,
                                                                options=options(h.name)),
                                       thread_id=run_id, run_id=run_id,
                                       upstream=upstream(h, srv), resume=False, timeout=120)
        paths = JournalPaths.for_run(handle.private_dir, run_id)
        nonce = new_nonce()
        first = None
        last = None
        phases = {"prepare": time.perf_counter() - t0}
        async with contextlib.AsyncExitStack() as stack:
            if detached:
                pending = await prepared.start_services(paths)
            else:
                await stack.enter_async_context(prepared.services())
            phases["services"] = time.perf_counter() - t0
            await launch_supervised_async(prepared.agent_spec(), paths, nonce)
            phases["launched"] = time.perf_counter() - t0
            if detached:
                await anyio.to_thread.run_sync(pending.ready)
            async for batch in translate_run(h, RunContext(run_id, run_id), paths,
                                             nonce=nonce):
                if batch.item is not None and first is None:
                    first = time.perf_counter() - t0
                if batch.exit is not None:
                    last = batch.events[-1]
        total = time.perf_counter() - t0
        if last is None or last.type.value != "RUN_FINISHED":
            raise SystemExit(f"corral {h.name} run failed: {last}")
        if not await handle.fs.exists("/workspace/out.txt"):
            raise SystemExit(f"corral {h.name} run did not create out.txt")
        return first or total, total, create, phases, t0
    finally:
        await provider.destroy(handle.ref)


def trace(label: str, requests: list[ModelRequest], t0: float, total: float) -> None:
    """One line per model request of a run: when it arrived at the scripted server and
    when its answer ended (ms since the run's start), and the gap since the previous
    answer's end (the agent's own work between two requests, plus any proxy cost)."""
    parts = []
    prev = None
    for r in requests:
        gap = "" if prev is None else f" (+{(r.arrived - prev) * 1e3:.0f})"
        parts.append(f"{r.path.split('?', 1)[0]} {r.reply} {(r.arrived - t0) * 1e3:.0f}{gap}"
                     f"-{(r.answered - t0) * 1e3:.0f}")
        prev = r.answered
    tail = f"; exit +{(t0 + total - prev) * 1e3:.0f}" if prev is not None else ""
    print(f"  {label}: {len(requests)} requests: " + ", ".join(parts) +
          f"; total {total * 1e3:.0f}{tail}", flush=True)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, round(p / 100 * (len(xs) - 1))))
    return xs[k]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--cli", nargs="+", default=["claude-code", "codex"])
    ap.add_argument("--services", choices=["inprocess", "detached"], default="inprocess",
                    help="model proxy in the driving process, or the detached daemon")
    ap.add_argument("--trace", action="store_true",
                    help="print each run's model requests: arrival and answer's end (ms "
                         "since the run's start), the gap since the previous answer")
    ap.add_argument("--direct-cgroup", action="store_true",
                    help="run the direct CLI in a cpu cgroup beside the sandboxes' (equal "
                         "CPU weight on a busy machine)")
    args = ap.parse_args()
    cgroup = direct_cgroup() if args.direct_cgroup else None
    if args.direct_cgroup and cgroup is None:
        raise SystemExit("--direct-cgroup needs the cgroup v1 cpu hierarchy with corral/")
    for name in args.cli:
        install_agent(harness_for(name).package.name if name.startswith("acp-") else name)
    provider = BubblewrapProvider()
    print(f"{args.runs} runs per CLI and mode, interleaved; services {args.services}; "
          f"direct run {'in a cgroup beside the sandboxes' if cgroup else 'at the root cgroup'}"
          "; times in ms (p50 / p90)")
    try:
        for name in args.cli:
            h = harness_for(name)
            direct_first: list[float] = []
            direct_total: list[float] = []
            c_first: list[float] = []
            c_total: list[float] = []
            creates: list[float] = []
            phases: dict[str, list[float]] = {}
            with ModelServer(shell_then_text("echo hi > out.txt && ls", "Done: {output}")) as srv:
                direct_run(h, srv, cgroup)  # warm the page cache for both modes
                for i in range(args.runs):
                    seen = len(srv.requests)
                    f, t, t0 = direct_run(h, srv, cgroup)
                    direct_first.append(f)
                    direct_total.append(t)
                    if args.trace:
                        trace(f"direct #{i}", srv.requests[seen:], t0, t)
                    seen = len(srv.requests)
                    f, t, c, ph, t0 = anyio.run(corral_run, h, srv, provider, i,
                                                args.services == "detached")
                    c_first.append(f)
                    c_total.append(t)
                    creates.append(c)
                    for k, v in ph.items():
                        phases.setdefault(k, []).append(v)
                    if args.trace:
                        trace(f"corral #{i}", srv.requests[seen:], t0, t)

            def row(label: str, xs: list[float]) -> str:
                return f"  {label:<34} {pct(xs, 50) * 1e3:7.0f} / {pct(xs, 90) * 1e3:7.0f}"

            print(f"{name} {h.version}")
            print(row("direct: first event", direct_first))
            print(row("corral bwrap: first event", c_first))
            print(row("direct: total", direct_total))
            print(row("corral bwrap: total", c_total))
            over_first = statistics.median(c_first) - statistics.median(direct_first)
            over_total = statistics.median(c_total) - statistics.median(direct_total)
            print(f"  overhead at p50: first event {over_first * 1e3:+.0f} ms, total "
                  f"{over_total * 1e3:+.0f} ms (target <= +150 ms)")
            # each corral run against the direct run just before it: drift on a shared
            # machine cancels out
            paired_first = statistics.median(c - d for c, d in zip(c_first, direct_first, strict=True))
            paired_total = statistics.median(c - d for c, d in zip(c_total, direct_total, strict=True))
            print(f"  paired overhead (median of corral - direct per pair): first event "
                  f"{paired_first * 1e3:+.0f} ms, total {paired_total * 1e3:+.0f} ms")
            print(row("(sandbox create, not included)", creates))
            for k, xs in phases.items():
                print(row(f"(corral: {k} done at)", xs))
    finally:
        if cgroup is not None:
            os.rmdir(cgroup)
    return 0


if __name__ == "__main__":
    sys.exit(main())
