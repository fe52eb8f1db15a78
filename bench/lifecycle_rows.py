"""The local provider on every row of the reference's own bench, side by side with it.

The reference (``../shared/anchors/tanstack/bench.mjs``, TanStack ``@tanstack/ai-sandbox``
0.2.4 with its local-process provider 0.2.0) times, per row, 5 warm-up runs (thrown away)
then N runs, with linearly interpolated percentiles (numpy's default). Its rows:

- ``time_to_interactive``: ``create``, then the first ``exec('true')`` (create + exec = time
  to interactive), then ``destroy`` of that sandbox: rows create, destroy, tti;
- ``exec_roundtrip``: ``exec('true')`` on a live sandbox: row exec;
- ``setup_plan_5_serial``: ``bootstrapWorkspace`` with 5 serial ``true`` steps on a live
  sandbox (corral: ``run_setup`` of the same plan): row setup_plan;
- ``ensure_with_setup_plan``: ``defineSandbox(...).ensure()``, create + that plan, destroy
  not timed (corral: ``Sandbox(..., Lifecycle(reuse="none")).ensure()`` with the default
  SQLite store): row ensure; and corral with its ``memory://`` store against the same job:
  row ensure_memstore (the reference keeps its sandboxes in memory);
- ``exec_50mb_stdout``: ``exec`` of ``head -c 52428800 /dev/zero | tr '\\0' 'a'``, the whole
  output checked: row stdout_50mib;
- ``spawn_stream_lines``: ``spawn('seq 1 200000')``, time until the last line is read:
  row stream_200k;
- ``fs_write_read_10mb``: ``fs.write`` then a read of 10 MiB of random bytes: row fs_10mib.

Each side runs in a long-lived worker: the reference's jobs in ``node`` (the same calls as
``bench.mjs``, importing the packages from ``--reference DIR``, a copy of the reference's
bench with ``npm install`` done), corral's in a Python worker per checkout (each importing
corral from its own ``src``). The driver asks the workers for one sample at a time, in a
rotating order (ref A B, A B ref, B ref A ...), so every side sees the same load; per row it
prints each side's p50 and the median of the per-sample paired ratios. ``--whole-runs``
instead runs the reference's own ``node bench.mjs --json`` unchanged, alternating whole runs
with corral's workers (the coarser check that the node worker measures what bench.mjs does).

    python bench/lifecycle_rows.py --b . [--a ../old-checkout] [--reference DIR] \\
        [--rounds 3] [--n 50] [--warmup 5] [--rows create,destroy,...] [--whole-runs]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# One sample per request line: the row's job name in, a JSON object of metrics (ms) out.
PY_WORKER = r"""
import json, os, sys, time, anyio
from corral import Lifecycle, RunContext, Sandbox, Workspace
from corral.providers._local import LocalProvider
from corral.sandbox._redact import Redactor
from corral.sandbox._setup_shell import run_setup
from corral.sandbox._workspace import Step
from corral.stores import open_store

BIG = 50 * 1024 * 1024
BIG_CMD = f"head -c {BIG} /dev/zero | tr '\\0' 'a'"
LINES = 200_000
FS = os.urandom(10 * 1024 * 1024)
PLAN = [Step("true") for _ in range(5)]
now = time.perf_counter

async def main():
    p = LocalProvider()
    h = await p.create()
    store = await open_store()
    sb = Sandbox(provider="local", workspace=Workspace(setup=["true"] * 5),
                 lifecycle=Lifecycle(reuse="none"))
    run = 0

    async def lifecycle():
        a = now()
        s = await p.create()
        b = now()
        r = await s.process.exec("true")
        c = now()
        await p.destroy(s.ref)
        d = now()
        ok = r.exit_code == 0 and not os.path.exists(s.state_dir)
        return {"ok": ok, "create": b - a, "tti": c - a, "destroy": d - c}

    async def exec_true():
        a = now()
        r = await h.process.exec("true")
        return {"ok": r.exit_code == 0, "exec": now() - a}

    async def big():
        a = now()
        r = await h.process.exec(BIG_CMD)
        ms = now() - a
        return {"ok": r.exit_code == 0 and len(r.stdout) == BIG and not r.stdout.strip(b"a"),
                "stdout_50mib": ms}

    async def stream():
        a = now()
        proc = await h.process.spawn(f"seq 1 {LINES}")
        lines, last, tail = 0, None, b""
        async with anyio.create_task_group() as tg:
            async def drain_err():
                async for _ in proc.stderr:
                    pass
            tg.start_soon(drain_err)
            async for chunk in proc.stdout:
                lines += chunk.count(b"\n")
                tail = (tail + chunk)[-16:]
                if lines == LINES and last is None:
                    last = now() - a
        r = await proc.wait()
        ok = r.exit_code == 0 and lines == LINES and tail.endswith(b"\n%d\n" % LINES)
        return {"ok": ok, "stream_200k": last if last is not None else now() - a}

    async def fs_rw():
        a = now()
        await h.fs.write("/workspace/bench-blob.bin", FS)
        back = await h.fs.read("/workspace/bench-blob.bin")
        return {"ok": back == FS, "fs_10mib": now() - a}

    async def plan():
        a = now()
        await run_setup(h, PLAN, env={}, redactor=Redactor({}))
        return {"ok": True, "setup_plan": now() - a}

    async def ensure(st=store, row="ensure"):
        nonlocal run
        run += 1
        ctx = RunContext(thread_id="bench", run_id=f"r{run}")
        a = now()
        e = await sb.ensure(ctx, store=st)
        ms = now() - a
        ok = os.path.isdir(e.handle.state_dir)
        await sb.destroy(ctx, store=st)
        return {"ok": ok, row: ms}

    memory = await open_store("memory://")

    async def ensure_mem():
        return await ensure(memory, "ensure_memstore")

    jobs = {"lifecycle": lifecycle, "exec": exec_true, "big": big, "stream": stream,
            "fs": fs_rw, "plan": plan, "ensure": ensure, "ensure_mem": ensure_mem}
    while True:
        line = await anyio.to_thread.run_sync(sys.stdin.readline)
        if not line or line.strip() == "quit":
            break
        res = await jobs[line.strip()]()
        print(json.dumps({k: (v * 1e3 if k != "ok" else v) for k, v in res.items()}), flush=True)
    await p.destroy(h.ref)
    await store.aclose()

anyio.run(main)
"""

# The reference's jobs, each the body of the matching measure() in bench.mjs.
NODE_WORKER = r"""
import { existsSync } from 'node:fs'
import { randomBytes } from 'node:crypto'
import readline from 'node:readline'
import { bootstrapWorkspace, defineSandbox, defineWorkspace } from '@tanstack/ai-sandbox'
import { localProcessSandbox } from '@tanstack/ai-sandbox-local-process'

const BIG_BYTES = 50 * 1024 * 1024
const BIG_CMD = `head -c ${BIG_BYTES} /dev/zero | tr '\\0' 'a'`
const LINES = 200_000
const LINES_CMD = `seq 1 ${LINES}`
const FS_BYTES = 10 * 1024 * 1024
const SETUP_STEPS = ['true', 'true', 'true', 'true', 'true']
const now = () => performance.now()
const provider = localProcessSandbox()
const h = await provider.create({})
const blob = randomBytes(FS_BYTES)
const file = '/workspace/bench-blob.bin'
const ws = defineWorkspace({ source: { type: 'none' }, setup: SETUP_STEPS })
const def = defineSandbox({ id: 'bench', provider, workspace: defineWorkspace({ source: { type: 'none' }, setup: SETUP_STEPS }), lifecycle: { reuse: 'none' } })
let run = 0

const jobs = {
  lifecycle: async () => {
    const a = now()
    const s = await provider.create({})
    const b = now()
    const r = await s.process.exec('true')
    const c = now()
    await s.destroy()
    const d = now()
    return { ok: r.exitCode === 0 && !existsSync(s.id), create: b - a, tti: c - a, destroy: d - c }
  },
  exec: async () => {
    const a = now()
    const r = await h.process.exec('true')
    return { ok: r.exitCode === 0, exec: now() - a }
  },
  big: async () => {
    const a = now()
    const r = await h.process.exec(BIG_CMD)
    const ms = now() - a
    return { ok: r.exitCode === 0 && r.stdout.length === BIG_BYTES && !/[^a]/.test(r.stdout), stdout_50mib: ms }
  },
  stream: async () => {
    const a = now()
    const p = await h.process.spawn(LINES_CMD)
    const exited = p.wait()
    const drainErr = (async () => { for await (const _ of p.stderr); })()
    let lines = 0
    let tail = ''
    let lastLineMs = NaN
    for await (const chunk of p.stdout) {
      for (let i = chunk.indexOf('\n'); i !== -1; i = chunk.indexOf('\n', i + 1)) lines++
      tail = (tail + chunk).slice(-16)
      if (lines === LINES && Number.isNaN(lastLineMs)) lastLineMs = now() - a
    }
    const code = await exited
    await drainErr
    return { ok: code === 0 && lines === LINES && tail.endsWith(`\n${LINES}\n`), stream_200k: lastLineMs }
  },
  fs: async () => {
    const a = now()
    await h.fs.write(file, blob)
    const back = await h.fs.readBytes(file)
    const c = now()
    return { ok: Buffer.from(back.buffer, back.byteOffset, back.byteLength).equals(blob), fs_10mib: c - a }
  },
  plan: async () => {
    const a = now()
    const r = await bootstrapWorkspace(h, ws)
    return { ok: r.ranSetup.length === SETUP_STEPS.length, setup_plan: now() - a }
  },
  ensure: async () => {
    const ctx = { threadId: 'bench', runId: `run-${run++}` }
    const a = now()
    const handle = await def.ensure(ctx)
    const ms = now() - a
    const ok = existsSync(handle.id)
    await def.destroy(ctx)
    return { ok, ensure: ms }
  },
}
// corral's ensure with its in-memory store is compared with the same job (the reference
// keeps its sandboxes in memory).
jobs.ensure_mem = async () => {
  const r = await jobs.ensure()
  return { ok: r.ok, ensure_memstore: r.ensure }
}

const rl = readline.createInterface({ input: process.stdin })
for await (const line of rl) {
  if (line.trim() === 'quit') break
  process.stdout.write(JSON.stringify(await jobs[line.trim()]()) + '\n')
}
await h.destroy()
"""

# (row, the worker job that measures it); one lifecycle sample gives three rows.
ROWS = (("create", "lifecycle"), ("destroy", "lifecycle"), ("tti", "lifecycle"),
        ("exec", "exec"), ("setup_plan", "plan"), ("ensure", "ensure"),
        ("ensure_memstore", "ensure_mem"),
        ("stdout_50mib", "big"), ("stream_200k", "stream"), ("fs_10mib", "fs"))


def pct(xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default, as the reference)."""
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo, hi = int(pos), min(int(pos) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


class Worker:
    def __init__(self, argv: list[str], *, env: dict[str, str] | None = None,
                 cwd: Path | None = None) -> None:
        self.proc = subprocess.Popen(argv, env=env, cwd=cwd, text=True, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)

    def sample(self, job: str) -> dict[str, float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(job + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"a worker died on {job!r}")
        res: dict[str, float] = json.loads(line)
        if not res.pop("ok"):
            raise SystemExit(f"a worker's {job!r} sample failed its check: {res}")
        return res

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("quit\n")
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def corral_worker(tree: Path, home: str) -> Worker:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"), CORRAL_HOME=home)
    env.pop("CORRAL_STORE", None)
    return Worker([sys.executable, "-c", PY_WORKER], env=env)


def reference_worker(directory: Path) -> Worker:
    return Worker(["node", "--input-type=module", "-e", NODE_WORKER], cwd=directory)


def reference_whole_run(directory: Path, n: int, warmup: int) -> dict[str, float]:
    out = subprocess.run(["node", "bench.mjs", "--json", "--n", str(n), "--warmup", str(warmup)],
                         cwd=directory, check=True, capture_output=True, text=True).stdout
    res = json.loads(out)["results"]
    tti = res["time_to_interactive"]
    return {
        "create": tti["create_ms"]["p50"], "tti": tti["tti_ms"]["p50"],
        "destroy": tti["destroy_ms"]["p50"], "exec": res["exec_roundtrip"]["ms"]["p50"],
        "setup_plan": res["setup_plan_5_serial"]["ms"]["p50"],
        "ensure": res["ensure_with_setup_plan"]["ms"]["p50"],
        "ensure_memstore": res["ensure_with_setup_plan"]["ms"]["p50"],
        "stdout_50mib": res["exec_50mb_stdout"]["ms"]["p50"],
        "stream_200k": res["spawn_stream_lines"]["last_line_ms"]["p50"],
        "fs_10mib": res["fs_write_read_10mb"]["total_ms"]["p50"],
    }


def one_round(workers: dict[str, Worker], rows: list[str], n: int,
              warmup: int) -> dict[str, dict[str, list[float]]]:
    """Samples per side and row, sides rotating per sample; also the paired ratios
    (key ``X/Y``)."""
    got: dict[str, dict[str, list[float]]] = {}
    names = list(workers)
    jobs = list(dict.fromkeys(job for row, job in ROWS if row in rows))
    for job in jobs:
        for i in range(warmup + n):
            order = names[i % len(names):] + names[:i % len(names)]
            sample = {side: workers[side].sample(job) for side in order}
            if i < warmup:
                continue
            for row in (r for r, j in ROWS if j == job and r in rows):
                for side in names:
                    got.setdefault(row, {}).setdefault(side, []).append(sample[side][row])
                for x, y in (("B", "ref"), ("A", "ref"), ("B", "A")):
                    if x in sample and y in sample:
                        got[row].setdefault(f"{x}/{y}", []).append(
                            sample[x][row] / sample[y][row])
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", type=Path, help="checkout A (the baseline)")
    ap.add_argument("--b", type=Path, required=True, help="checkout B")
    ap.add_argument("--reference", type=Path, help="the reference's bench dir (npm installed)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rows", default=",".join(r for r, _ in ROWS),
                    help="comma-separated rows (default: all)")
    ap.add_argument("--whole-runs", action="store_true",
                    help="alternate whole runs of the reference's own bench.mjs instead")
    args = ap.parse_args()
    rows = [r for r in args.rows.split(",") if r]
    unknown = set(rows) - {r for r, _ in ROWS}
    if unknown:
        ap.error(f"unknown rows {sorted(unknown)}; pick from {[r for r, _ in ROWS]}")
    trees = {"A": args.a, "B": args.b}
    print(f"A = {args.a}, B = {args.b}, reference = {args.reference}; n = {args.n} after "
          f"{args.warmup} warm-up samples; {'whole runs' if args.whole_runs else 'samples'} "
          "alternate; p50 in ms, ratios are medians of per-sample paired ratios")
    with tempfile.TemporaryDirectory(prefix="corral-rows-") as tmp:
        for r in range(args.rounds):
            load = os.getloadavg()
            workers: dict[str, Worker] = {}
            if args.reference and not args.whole_runs:
                workers["ref"] = reference_worker(args.reference)
            for side, tree in trees.items():
                if tree is not None:
                    home = Path(tmp) / f"{side}{r}"
                    home.mkdir()
                    workers[side] = corral_worker(tree.resolve(), str(home))
            try:
                got = one_round(workers, rows, args.n, args.warmup)
                if args.reference and args.whole_runs:
                    whole = reference_whole_run(args.reference, args.n, args.warmup)
                    for row in rows:
                        got[row]["ref"] = [whole[row]]
            finally:
                for w in workers.values():
                    w.close()
            end = os.getloadavg()
            print(f"round {r + 1} (load average 1 min {load[0]:.2f} -> {end[0]:.2f})")
            keys = [k for k in ("ref", "A", "B", "B/ref", "A/ref", "B/A") if k in got[rows[0]]]
            print(f"  {'row':<14}" + "".join(f"{k:>10}" for k in keys))
            for row in rows:
                print(f"  {row:<14}" + "".join(
                    f"{pct(got[row][k], 0.5):9.3f}{'x' if '/' in k else ' '}" for k in keys),
                    flush=True)


if __name__ == "__main__":
    main()
