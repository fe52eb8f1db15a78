"""``corral approve``: answer (or list) a run's pending host-tool approvals.

``corral approve RUN_ID APPROVAL_ID --allow|--deny [--reason TEXT]`` answers one request
(the id comes from the run's ``corral.approval_request`` event); ``corral approve RUN_ID
--list [--json]`` shows what is waiting. The approvals live in the store (``--store``,
``CORRAL_STORE``): any process on any host sharing it can answer, wherever the run is
driven.
"""

from __future__ import annotations

import argparse
import json
import time

from corral._errors import ConfigError
from corral.cli._store import with_store
from corral.stores._protocols import Store
from corral.tools._approvals import answer_approval, list_pending

__all__ = ["approve"]


def approve(args: argparse.Namespace) -> int:
    if args.list:
        return with_store(args, lambda store: _list(store, args))
    if not args.approval_id:
        raise ConfigError("corral approve: give the APPROVAL_ID (see `corral approve "
                          f"{args.run_id} --list`), or use --list")
    if not (args.allow or args.deny):
        raise ConfigError("corral approve: say --allow or --deny")
    with_store(args, lambda store: answer_approval(store, args.run_id, args.approval_id,
                                                   bool(args.allow), reason=args.reason))
    print(f"{'allowed' if args.allow else 'denied'} {args.approval_id}")
    return 0


async def _list(store: Store, args: argparse.Namespace) -> int:
    now = time.time()
    pending = await list_pending(store, args.run_id)
    if args.json:
        # one answer: one array; the HTTP API's names (GET /v1/runs/{id}/approvals)
        print(json.dumps([{"approval_id": a.approval_id, "run_id": a.run_id,
                           "tool": a.tool, "args": a.args,
                           "created_at": a.created_at, "expires_at": a.expires_at}
                          for a in pending]))
        return 0
    for a in pending:
        print(f"{a.approval_id}  {a.tool}  {json.dumps(a.args)}  "
              f"(expires in {max(0, a.expires_at - now):.0f}s)")
    return 0
