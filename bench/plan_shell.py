"""Bubblewrap setup plan (issue #17): where a 5-step plan's time goes past one bare ``sh``.

Round-robin in one live bubblewrap sandbox, each variant's p50 and its p50 ratio to the
``bare bwrap, sh`` sample of the same round (paired):

- ``bare bwrap, sh``: ``bwrap`` with the sandbox's options (no init) running
  ``sh -c 'true; true; true; true; true'`` as the host uid (#17's baseline for the plan);
- ``bare bwrap, bash``: the same with ``bash -c``: what ``bash`` itself costs;
- ``exec sh -c 5 x true``: the provider's ``exec`` of that ``sh`` line (launcher, bwrap,
  init): the plan's floor if it ran in ``sh`` and reported nothing per step;
- ``exec bash -c 5 x true``: the same in ``bash``;
- ``setup plan 5 x true``: ``run_setup`` (one ``bash``, per-step records, exit codes,
  tails).

    PYTHONPATH=src python bench/plan_shell.py [--runs 60]

Needs root (the sandbox's host uid).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable

import anyio

from corral.providers._bubblewrap import BubblewrapProvider
from corral.sandbox._redact import Redactor
from corral.sandbox._setup_shell import run_setup
from corral.sandbox._workspace import Step

FIVE = "true; true; true; true; true"


async def main(runs: int) -> None:
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as home:
        os.environ["CORRAL_HOME"] = home
        p = BubblewrapProvider()
        h = await p.create()
        uid = h.state.host_uid
        assert uid is not None, "run as root"
        opts = [a for a in h._bwrap]
        i = opts.index("/run/corral-init") if "/run/corral-init" in opts else -1
        if i > 0:
            del opts[i - 2:i + 1]  # bare bwrap runs no init

        async def bare(shell: str) -> None:
            subprocess.run([*opts, "--", shell, "-c", FIVE], check=True, user=uid, group=uid,
                           extra_groups=[])

        async def exec_(shell: str) -> None:
            r = await h.process.exec([shell, "-c", FIVE])
            assert r.ok, r

        async def plan() -> None:
            await run_setup(h, [Step("true") for _ in range(5)], env={}, redactor=Redactor({}))

        fns: dict[str, Callable[[], Awaitable[None]]] = {
            "bare bwrap, sh": lambda: bare("sh"),
            "bare bwrap, bash": lambda: bare("bash"),
            "exec sh -c 5 x true": lambda: exec_("sh"),
            "exec bash -c 5 x true": lambda: exec_("bash"),
            "setup plan 5 x true": plan,
        }
        samples: dict[str, list[float]] = {k: [] for k in fns}
        load0 = os.getloadavg()[0]
        try:
            for n in range(runs + 3):
                for name, fn in fns.items():
                    t = time.perf_counter()
                    await fn()
                    if n >= 3:  # warm-up
                        samples[name].append(time.perf_counter() - t)
        finally:
            await p.destroy(h.ref)
        base = samples["bare bwrap, sh"]
        print(f"runs {runs}, load {load0:.2f} -> {os.getloadavg()[0]:.2f}")
        for k, v in samples.items():
            ratio = statistics.median([a / b for a, b in zip(v, base, strict=True)])
            print(f"  {k:<24} p50 {statistics.median(v) * 1000:6.2f} ms   "
                  f"/ bare sh (paired) p50 {ratio:5.2f}x")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=60)
    anyio.run(main, ap.parse_args().runs)
