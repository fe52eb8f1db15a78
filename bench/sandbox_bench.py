"""Sandbox definitions: policy evaluation throughput, ensure timings (create / resume /
restore from an after-setup snapshot) on bubblewrap, and redaction throughput.

Run: PYTHONPATH=src python bench/sandbox_bench.py
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import anyio

from corral import Lifecycle, Policy, Redactor, RunContext, Sandbox, Workspace


def bench_policy() -> None:
    p = Policy(allow=["pytest *", "git *", "ls *", "cat *"], deny=["rm -rf *", "curl *"])
    cmds = [
        "pytest -q tests/test_x.py",
        "git status && git diff HEAD~1 -- src | cat",
        "bash -c 'for f in $(ls src); do cat \"$f\"; done'",
        "timeout 60 sudo -u root env A=1 sh -c 'echo $(curl -s x) | rm -rf /'",
    ]
    for cmd in cmds:
        n = 3000
        t0 = time.perf_counter()
        for _ in range(n):
            p.evaluate(cmd)
        dt = (time.perf_counter() - t0) / n
        print(f"policy.evaluate {len(cmd):3} chars: {dt * 1e6:7.1f} us/command")


def bench_redact() -> None:
    r = Redactor({f"S{i}": os.urandom(16).hex() for i in range(10)})
    text = "lorem ipsum dolor sit amet " * 40_000  # ~1 MB
    t0 = time.perf_counter()
    r.redact(text)
    dt = time.perf_counter() - t0
    print(f"redact, 10 secrets (x{len(r.values()) // 10} encodings each), 1 MB text: {len(text) / dt / 1e6:.1f} MB/s")


async def bench_ensure() -> None:
    from corral.stores import open_store

    store = await open_store()
    sb = Sandbox(
        provider="bubblewrap",
        workspace=Workspace(setup=["mkdir -p a && cd a", "export X=1", "echo $X > x"]),
        lifecycle=Lifecycle(snapshot="after-setup"),
    )
    create, resume, restore = [], [], []
    try:
        for i in range(5):
            ctx = RunContext(f"t{i}", "r1")
            t0 = time.perf_counter()
            e = await sb.ensure(ctx, store=store)
            create.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await sb.ensure(RunContext(f"t{i}", "r2"), store=store)
            resume.append(time.perf_counter() - t0)
            await sb.get_provider().destroy(e.handle.id)
            t0 = time.perf_counter()
            await sb.ensure(RunContext(f"t{i}", "r3"), store=store)
            restore.append(time.perf_counter() - t0)
            await sb.destroy(RunContext(f"t{i}", "r3"), store=store)
    finally:
        await store.aclose()
    for name, xs in (("create+bootstrap (3 setup steps)+snapshot", create), ("resume", resume),
                     ("restore from snapshot", restore)):  # fmt: skip
        print(f"ensure {name}: median {statistics.median(xs) * 1e3:.1f} ms, max {max(xs) * 1e3:.1f} ms over {len(xs)}")


if __name__ == "__main__":
    os.environ.setdefault("CORRAL_HOME", tempfile.mkdtemp(prefix="corral-bench-"))
    bench_policy()
    bench_redact()
    anyio.run(bench_ensure)
