"""Bubblewrap launcher chain (issue #17): what each way of starting a sandboxed command costs.

Raw process level, no asyncio: each variant starts the sandbox's init (the same ``perl``
script, command ``true``, its environment over stdin) in one live bubblewrap sandbox, and
waits for it. The variants are sampled round-robin (the machine is shared), and each
prints its p50 and its p50 difference to the bare sample of the same round:

- ``bare bwrap + init``: ``bwrap`` with the sandbox's options, started as the host uid by
  Popen's ``user=`` (no cgroups joined: the floor);
- ``sh + setpriv + bwrap`` (before #17's launcher change; still ``host_command``'s chain):
  ``sh`` joins the cgroups, ``setpriv`` drops to the host uid, then ``bwrap``;
- ``Popen(user=) + bwrap --args``: bwrap started as the host uid by CPython (fork, no vfork),
  held on ``--args`` while corral writes its pid to the cgroups;
- ``setpriv + bwrap --args`` (what ``exec``/``spawn`` do now): the same, with ``setpriv``
  dropping the uid (vfork);
- ``exec(["true"])``: the provider's own exec, for reference.

    PYTHONPATH=src python bench/launcher_chain.py [--runs 60]

Needs root and cgroup v1 (the sandbox must be in the cgroup limit mode).
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
from corral.providers._process import popen


def variants(p: BubblewrapProvider, h: BubblewrapHandle) -> dict[str, Callable[[], object]]:
    uid = h.state.host_uid
    assert uid is not None and h.state.limit_mode == "cgroup", "run as root, with cgroup v1"
    prefix = launch_prefix("/workspace", h._env, ["true"])
    init = h._init(-1, -1)

    def bare() -> None:
        subprocess.run([*h._bwrap, "--", *init], input=prefix, check=True,
                       user=uid, group=uid, extra_groups=[])

    def old_chain() -> None:
        proc = popen([*h._launcher, *h._bwrap, "--", *init], env=h._host_env)
        proc.communicate(prefix)

    def held(front: list[str], as_uid: int | None) -> None:
        r, w = os.pipe2(os.O_CLOEXEC)
        try:
            argv = [*front, p.bwrap, "--args", str(r), "--", *init]
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, env=h._host_env,
                                    start_new_session=True, pass_fds=(r,), user=as_uid,
                                    group=as_uid, extra_groups=None if as_uid is None else [])
        finally:
            os.close(r)
        try:
            h._confine(proc.pid)
            _write_all(w, h._bwrap_args)
        finally:
            os.close(w)
        proc.communicate(prefix)

    return {
        "bare bwrap + init": bare,
        "sh + setpriv + bwrap": old_chain,
        "Popen(user=) + bwrap --args": lambda: held([], uid),
        "setpriv + bwrap --args": lambda: held(h._start_prefix, None),
    }


async def main(runs: int) -> None:
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as home:
        os.environ["CORRAL_HOME"] = home
        p = BubblewrapProvider()
        h = await p.create()
        try:
            fns = variants(p, h)
            samples: dict[str, list[float]] = {k: [] for k in [*fns, 'exec(["true"])']}
            for i in range(runs + 3):
                got: dict[str, float] = {}
                for name, fn in fns.items():
                    t = time.perf_counter()
                    fn()
                    got[name] = time.perf_counter() - t
                t = time.perf_counter()
                r = await h.process.exec(["true"])
                got['exec(["true"])'] = time.perf_counter() - t
                assert r.ok, r
                if i >= 3:  # warm-up
                    for k, dt in got.items():
                        samples[k].append(dt)
            bare = samples["bare bwrap + init"]
            print(f"runs {runs}, load {os.getloadavg()[0]:.2f}")
            for k, v in samples.items():
                diff = statistics.median([a - b for a, b in zip(v, bare, strict=True)])
                print(f"  {k:<30} p50 {statistics.median(v) * 1000:6.2f} ms   "
                      f"minus bare (paired) p50 {diff * 1000:+6.2f} ms")
        finally:
            await p.destroy(h.ref)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=60)
    anyio.run(main, ap.parse_args().runs)
