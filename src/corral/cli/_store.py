"""The store for a command: one way to run an async command with the store ``--store`` names
(:func:`corral._cmdline.add_store_option`) opened and closed around it."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from corral.stores import open_store
from corral.stores._protocols import Store

T = TypeVar("T")

__all__ = ["with_store"]


def with_store(args: argparse.Namespace, command: Callable[[Store], Awaitable[T]]) -> T:
    """Run ``command(store)`` in a new event loop with the store ``--store`` names (default:
    ``$CORRAL_STORE`` or SQLite), closing the store whatever happens. A bad URL raises
    :class:`~corral.ConfigError`, reported by the entry point as one line."""

    async def main() -> T:
        store = await open_store(args.store)
        try:
            return await command(store)
        finally:
            with anyio.CancelScope(shield=True):
                await store.aclose()

    return anyio.run(main)
