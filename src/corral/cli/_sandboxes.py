"""``corral sandboxes ls|rm|prune`` and ``corral gc``: list, remove and sweep the sandboxes
of every registered provider.

``ls`` and ``rm`` are scoped to the store ``--store`` names (default: ``$CORRAL_STORE`` or
the SQLite store in ``$CORRAL_HOME``), as ``corral gc`` is: a Docker daemon is shared by
every store on the machine, and a ``$CORRAL_HOME`` may be shared by several stores. ``ls
--all-stores`` shows the others' too; ``rm`` refuses a sandbox of another store, or of a
run that is running, unless ``--force``. ``gc`` destroys the sandboxes idle past their
``keep_alive``, and orphans."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import anyio

from corral._errors import ConfigError, CorralError
from corral._paths import home_label
from corral.cli._store import with_store
from corral.providers import get_provider, provider_names
from corral.providers._state import validate_id
from corral.sandbox._contracts import Described, Provider, PrunesOrphans, SandboxDirs
from corral.sandbox._ensure import store_id
from corral.sandbox._gc import GcReport, collect_idle
from corral.stores._protocols import InstanceStore, Store
from corral.stores._records import RunStatus

__all__ = ["run_gc", "run_ls", "run_prune", "run_rm"]


def run_prune(args: argparse.Namespace) -> int:
    provider = get_provider("bubblewrap")  # (its module loads for this command only)
    if not isinstance(provider, PrunesOrphans):
        raise ConfigError(f"the {provider.name} provider cannot prune orphaned sandboxes")

    async def main() -> int:
        for path in await provider.prune_orphans():
            print(f"pruned {path}")
        return 0

    return anyio.run(main)


def _providers(only: str | None) -> list[Provider]:
    out: list[Provider] = []
    # every registered provider (a plugin's too) that builds with its default config
    for name in [only] if only else provider_names():
        try:
            out.append(get_provider(name))
        except CorralError:
            if only:
                raise
    return out


async def _resume(provider: Provider, sandbox_id: str, only: str | None) -> object:
    """The sandbox, ``None`` when absent; a provider that cannot answer (no Docker daemon)
    has none, unless it is the one asked for."""
    try:
        return await provider.resume(sandbox_id)
    except CorralError:
        if only:
            raise
        return None


async def _resume_quietly(provider: Provider, sandbox_id: str) -> object:
    try:
        return await provider.resume(sandbox_id)
    except CorralError:
        return None


class _Scope:
    """Which sandboxes are this store's: labelled with its store label (sandboxes of runs),
    or, made with no store (``corral exec --keep``), with this ``$CORRAL_HOME``'s label.
    An unlabelled one is this home's only when its provider keeps it under the home (a
    host-directory provider, e.g. bubblewrap); on a shared daemon nobody can tell whose it
    is, so it counts as another store's."""

    def __init__(self, store: Store, ours: str | None) -> None:
        self.store = store
        self.ours = ours
        self.home = home_label()

    async def row(self, provider: Provider, sandbox_id: str, handle: object) -> dict[str, Any]:
        info = handle if isinstance(handle, Described) else None
        labels = dict(info.labels) if info else {}
        store_label = labels.get("corral.store")
        home = labels.get("corral.home")
        if store_label is not None:
            this = self.ours is not None and store_label == self.ours
        elif home is not None:
            this = home == self.home
        else:
            this = isinstance(provider, SandboxDirs)
        run_id, status = labels.get("corral.run"), None
        if this:
            run_id, status = await self._run_of(provider, sandbox_id, labels)
        return {
            "id": sandbox_id,
            "provider": provider.name,
            "created_at": info.created_at if info else None,
            "labels": labels,
            "store": store_label or (f"home:{home}" if home else None),
            "this_store": this,
            "run": run_id,
            "run_status": status,
        }

    async def _run_of(self, provider: Provider, sandbox_id: str,
                      labels: dict[str, str]) -> tuple[str | None, str | None]:
        """The run that last used the sandbox (its instance record's latest run, else the
        run it was made for) and that run's status in this store."""
        run_id = labels.get("corral.run")
        key = labels.get("corral.key")
        if key and isinstance(self.store, InstanceStore):
            record = await self.store.get_instance(key)
            if record is not None and record.provider == provider.name and \
                    record.provider_sandbox_id == sandbox_id and record.latest_run_id:
                run_id = record.latest_run_id
        if run_id is None:
            return None, None
        run = await self.store.get(run_id)
        return run_id, run.status.value if run is not None else None


async def _scope(store: Store) -> _Scope:
    return _Scope(store, await store_id(store))


def _running(row: dict[str, Any]) -> bool:
    status = row["run_status"]
    return status is not None and not RunStatus(status).terminal


def run_ls(args: argparse.Namespace) -> int:
    async def main(store: Store) -> int:
        scope = await _scope(store)
        rows: list[dict[str, Any]] = []
        for provider in _providers(args.provider):
            try:
                refs = await provider.list()
            except CorralError:
                if args.provider:
                    raise
                continue  # e.g. no Docker daemon here: it has no sandboxes to list
            for ref in refs:
                row = await scope.row(provider, ref.id, await _resume_quietly(provider, ref.id))
                if row["this_store"] or args.all_stores:
                    rows.append(row)
        if args.json:  # one answer: one document, an array (also when empty)
            print(json.dumps(rows, sort_keys=True))
        else:  # the header even for none, as `docker ps` does
            print(f"{'ID':<28} {'PROVIDER':<11} {'CREATED':<19} {'STORE':<22} RUN")
            for row in rows:
                ts = row["created_at"]
                created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if isinstance(ts, float) else "?"
                owner = "this" if row["this_store"] else (row["store"] or "?")
                run = " ".join(x for x in (row["run"], row["run_status"]) if x) or "-"
                print(f"{row['id']:<28} {row['provider']:<11} {created:<19} {owner:<22} {run}")
        return 0

    return with_store(args, main)


def run_rm(args: argparse.Namespace) -> int:
    async def main(store: Store) -> int:
        scope = await _scope(store)
        providers = _providers(args.provider)
        missing: list[str] = []
        targets: list[tuple[Provider, str]] = []
        for sandbox_id in args.ids:
            validate_id(sandbox_id)
            found = False
            for provider in providers:
                handle = await _resume(provider, sandbox_id, args.provider)
                if handle is None and not (isinstance(provider, SandboxDirs)
                                           and (provider.base_dir / sandbox_id).exists()):
                    continue
                found = True
                row = await scope.row(provider, sandbox_id, handle)
                if not args.force:
                    _refuse(row)
                targets.append((provider, sandbox_id))
            if not found:
                missing.append(sandbox_id)
        if missing:
            raise ConfigError(
                f"no sandbox named {', '.join(missing)}: list them with `corral sandboxes ls`"
            )
        # nothing is removed unless every one named may be
        for provider, sandbox_id in targets:
            await provider.destroy(sandbox_id)
            print(f"removed {provider.name} sandbox {sandbox_id}")
        return 0

    return with_store(args, main)


def _refuse(row: dict[str, Any]) -> None:
    """One line when the sandbox is not the user's to remove without ``--force``."""
    what = f"{row['provider']} sandbox {row['id']}"
    if not row["this_store"]:
        whose = f" ({row['store']})" if row["store"] else ""
        run = f", made for run {row['run']}" if row["run"] else ""
        raise ConfigError(
            f"{what} belongs to another store{whose}{run}, whose runs may be using it: "
            "remove it from that store, or pass --force to remove it anyway"
        )
    if _running(row):
        raise ConfigError(
            f"{what} is in use by run {row['run']}, which is running: cancel the run "
            f"(corral cancel {row['run']}), or pass --force to remove it anyway"
        )


def run_gc(args: argparse.Namespace) -> int:
    async def collect(store: Store) -> GcReport:
        return await collect_idle(store, dry_run=args.dry_run, limit=args.limit,
                                  orphan_grace=args.orphan_grace)

    report = with_store(args, collect)
    if args.json:  # one answer: one document, also when nothing was done
        print(json.dumps({
            "dry_run": bool(args.dry_run),
            "entries": [{"key": e.key, "provider": e.provider, "sandbox": e.sandbox_id,
                         "outcome": e.outcome, "detail": e.detail} for e in report.entries],
            "counts": dict(sorted(report.counts.items())),
            "chunks": report.chunks,
        }))
    else:
        for e in report.entries:
            print(f"{e.outcome:15} {e.provider}/{e.sandbox_id} {e.detail}".rstrip())
        summary = ", ".join(f"{n} {k}" for k, n in sorted(report.counts.items())) or "nothing idle"
        if report.chunks:
            summary += f"; {report.chunks} checkpoint chunk(s) no checkpoint names freed"
        print(f"gc: {summary}")
    return 1 if report.counts.get("destroy-failed") else 0
