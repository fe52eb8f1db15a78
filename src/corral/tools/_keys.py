"""corral's own key: what signs approval ids and derives per-run tool tokens.

Every host that drives or answers a run must hold the same key, so it lives where they all
look: the store (:meth:`corral.abc.SecretStore.shared_secret`, made on first use), or,
when an operator sets it, ``CORRAL_SECRET`` in each host's environment (then the key is in
no database). ``CORRAL_SECRET`` is any string of at least 32 characters (base64, hex or
other text, e.g. ``openssl rand -base64 32``); it is hashed (SHA-256) into the key, never
decoded, so every host must set exactly the same string. The key is only ever used as an
HMAC key: it is written to no event, log, run record or sandbox.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from typing import Final

from corral._errors import ConfigError
from corral.stores._protocols import SecretStore

__all__ = ["MIN_SECRET_CHARS", "SECRET_ENV", "SECRET_NAME", "b64", "corral_key",
           "derive_token", "key_from_env"]

SECRET_ENV: Final = "CORRAL_SECRET"
SECRET_NAME: Final = "approvals"
"""The name of corral's key in the store (:meth:`SecretStore.shared_secret`)."""
MIN_SECRET_CHARS: Final = 32


def b64(data: bytes) -> str:
    """URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def key_from_env() -> bytes | None:
    """SHA-256 of ``$CORRAL_SECRET``, ``None`` when it is unset. Raises
    :class:`~corral.ConfigError` for one that is set but shorter than 32 characters (an
    empty value too: a template that lost its variable must not fall back to the store's
    key silently, or this host would disagree with the others)."""
    value = os.environ.get(SECRET_ENV)
    if value is None:
        return None
    if len(value) < MIN_SECRET_CHARS:
        raise ConfigError(f"{SECRET_ENV} is {len(value)} characters long; it needs at least "
                          f"{MIN_SECRET_CHARS} (e.g. the output of `openssl rand -base64 32`), "
                          "the same on every host, or unset it to use the store's key")
    return hashlib.sha256(os.fsencode(value)).digest()  # the bytes the operator set


async def corral_key(store: SecretStore) -> bytes:
    """corral's key: from ``CORRAL_SECRET`` when set, else the store's shared secret."""
    return key_from_env() or await store.shared_secret(SECRET_NAME)


def derive_token(key: bytes, label: str, run_id: str) -> str:
    """A value bound to ``key``, ``label`` and ``run_id``: every host holding the key
    derives the same one, so nothing needs storing."""
    return b64(hmac.new(key, f"{label}\0{run_id}".encode("utf-8", "surrogatepass"),
                        hashlib.sha256).digest())
