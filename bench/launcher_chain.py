"""Bubblewrap launcher chain (issue #17): what each way of starting a sandboxed command costs.

Raw process level, no asyncio: each variant starts a command (``true``, its environment
over stdin) in one live bubblewrap sandbox, and waits for it. The variants are sampled
round-robin (the machine is shared), and each prints its p50 and its p50 difference to the
``bare bwrap, true`` sample of the same round (paired):

- ``bare bwrap, true``: ``bwrap`` with the sandbox's options running ``true``, started as
  the host uid by Popen's ``user=`` (no cgroups joined, no init: the floor, and the
  baseline of #17's "+3 ms over bare bwrap" target);
- ``bare bwrap + C init`` / ``bare bwrap + perl init``: the same running the sandbox's init
  (which then runs ``true``): what each init costs;
- ``Popen(user=) + bwrap --args + C init``: bwrap started as the host uid by CPython (fork,
  no vfork), held on ``--args`` while corral writes its pid to the cgroups;
- ``setpriv + bwrap --args + C init`` / ``+ perl init``: the same, with ``setpriv``
  dropping the uid (vfork); with perl, what ``exec``/``spawn`` did before the C init;
- ``launcher + bwrap --args + C init``: corral's own static launcher instead of
  ``setpriv``: what ``exec``/``spawn`` do now;
- ``exec(["true"]), C init`` / ``perl init``: the provider's own exec (two sandboxes, one
  provider per init), for reference.

    PYTHONPATH=src python bench/launcher_chain.py [--runs 60]

Needs root and cgroup v1 (the sandbox must be in the cgroup limit mode), and a C compiler.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable

import anyio

from corral.providers._bubblewrap import (
    BubblewrapHandle,
    BubblewrapProvider,
    _write_all,
    launch_prefix,
)


def variants(h: BubblewrapHandle, hp: BubblewrapHandle) -> dict[str, Callable[[], object]]:
    """``h`` runs the C init, ``hp`` (the same kind of sandbox) the perl one."""
    uid = h.state.host_uid
    assert uid is not None and h.state.limit_mode == "cgroup", "run as root, with cgroup v1"
    assert h._provider.init.launcher is not None, h._provider.init.reason
    assert hp._start_prefix[0].endswith("setpriv"), hp._start_prefix
    prefix = launch_prefix("/workspace", h._env, ["true"])

    def bare(handle: BubblewrapHandle, argv: list[str], stdin: bytes | None) -> None:
        subprocess.run([*handle._bwrap, "--", *argv], input=stdin, check=True,
                       user=uid, group=uid, extra_groups=[])

    def held(handle: BubblewrapHandle, front: list[str], as_uid: int | None) -> None:
        r, w = os.pipe2(os.O_CLOEXEC)
        try:
            argv = [*front, handle._provider.bwrap, "--args", str(r), "--",
                    *handle._init(-1, -1)]
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, env=handle._host_env,
                                    start_new_session=True, pass_fds=(r,), user=as_uid,
                                    group=as_uid, extra_groups=None if as_uid is None else [])
        finally:
            os.close(r)
        try:
            handle._confine(proc.pid)
            _write_all(w, handle._bwrap_args)
        finally:
            os.close(w)
        proc.communicate(prefix)

    return {
        "bare bwrap, true": lambda: bare(h, ["true"], None),
        "bare bwrap + C init": lambda: bare(h, h._init(-1, -1), prefix),
        "bare bwrap + perl init": lambda: bare(hp, hp._init(-1, -1), prefix),
        "Popen(user=) + bwrap --args + C init": lambda: held(h, [], uid),
        "setpriv + bwrap --args + C init": lambda: held(h, hp._start_prefix, None),
        "launcher + bwrap --args + C init": lambda: held(h, h._start_prefix, None),
        "setpriv + bwrap --args + perl init": lambda: held(hp, hp._start_prefix, None),
    }


async def main(runs: int) -> None:
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as home:
        os.environ["CORRAL_HOME"] = home
        p, pp = BubblewrapProvider(), BubblewrapProvider(init="perl")
        h, hp = await p.create(), await pp.create()
        try:
            fns = variants(h, hp)
            execs = {'exec(["true"]), C init': h, 'exec(["true"]), perl init': hp}
            samples: dict[str, list[float]] = {k: [] for k in [*fns, *execs]}
            for i in range(runs + 3):
                got: dict[str, float] = {}
                for name, fn in fns.items():
                    t = time.perf_counter()
                    fn()
                    got[name] = time.perf_counter() - t
                for name, handle in execs.items():
                    t = time.perf_counter()
                    r = await handle.process.exec(["true"])
                    got[name] = time.perf_counter() - t
                    assert r.ok, r
                if i >= 3:  # warm-up
                    for k, dt in got.items():
                        samples[k].append(dt)
            bare = samples["bare bwrap, true"]
            print(f"runs {runs}, load {os.getloadavg()[0]:.2f}")
            for k, v in samples.items():
                diff = statistics.median([a - b for a, b in zip(v, bare, strict=True)])
                print(f"  {k:<38} p50 {statistics.median(v) * 1000:6.2f} ms   "
                      f"minus bare true (paired) p50 {diff * 1000:+6.2f} ms")
        finally:
            await p.destroy(h.ref)
            await pp.destroy(hp.ref)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=60)
    anyio.run(main, ap.parse_args().runs)
