"""``corral sandboxes ls|rm|prune``: list and remove sandboxes of every host-directory provider
(the parser is in :mod:`corral.cli._sandboxes_cmd`)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import anyio

from corral._errors import ConfigError, CorralError
from corral.providers import get_provider, provider_names
from corral.providers._state import validate_id
from corral.sandbox._contracts import Described, Provider

__all__ = ["run_ls", "run_prune", "run_rm"]


def run_prune(args: argparse.Namespace) -> int:
    # bubblewrap's module loads for this command only, not for `sandboxes ls|rm`
    from corral.providers._bubblewrap import BubblewrapProvider

    async def main() -> int:
        for path in await BubblewrapProvider().prune_orphans():
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


def run_ls(args: argparse.Namespace) -> int:
    async def main() -> int:
        rows: list[dict[str, Any]] = []
        for provider in _providers(args.provider):
            try:
                refs = await provider.list()
            except CorralError:
                if args.provider:
                    raise
                continue  # e.g. no Docker daemon here: it has no sandboxes to list
            for ref in refs:
                handle = await provider.resume(ref)
                info = handle if isinstance(handle, Described) else None
                rows.append({
                    "id": ref.id,
                    "provider": ref.provider,
                    "created_at": info.created_at if info else None,
                    "labels": dict(info.labels) if info else {},
                })
        if args.json:
            for row in rows:
                print(json.dumps(row, sort_keys=True))
        else:  # the header even for none, as `docker ps` does
            print(f"{'ID':<28} {'PROVIDER':<11} CREATED")
            for row in rows:
                ts = row["created_at"]
                created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if isinstance(ts, float) else "?"
                print(f"{row['id']:<28} {row['provider']:<11} {created}")
        return 0

    return anyio.run(main)


def run_rm(args: argparse.Namespace) -> int:
    async def main() -> int:
        providers = _providers(args.provider)
        missing = []
        for sandbox_id in args.ids:
            validate_id(sandbox_id)
            found = False
            for provider in providers:
                base = getattr(provider, "base_dir", None)  # host-directory providers
                if await _resume(provider, sandbox_id, args.provider) is not None or (
                    base is not None and (base / sandbox_id).exists()
                ):
                    await provider.destroy(sandbox_id)
                    print(f"removed {provider.name} sandbox {sandbox_id}")
                    found = True
            if not found:
                missing.append(sandbox_id)
        if missing:
            raise ConfigError(
                f"no sandbox named {', '.join(missing)}: list them with `corral sandboxes ls`"
            )
        return 0

    return anyio.run(main)
