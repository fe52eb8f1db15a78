"""What a run's model tokens cost: a price table (US dollars per million tokens, by model)
applied to the usage the model proxy metered per model.

corral ships list prices for the models its agent CLIs use by default; an operator sets
their own (negotiated prices, other models) in a JSON file named by ``$CORRAL_PRICES``::

    {"claude-sonnet-4-5": {"input": 3, "output": 15, "cache_read": 0.3, "cache_write": 3.75},
     "my-finetune": {"input": 1, "output": 2}}

Entries there replace corral's entry of the same name. A model matches the longest entry
that is a prefix of its name (``claude-sonnet-4-5-20250929`` → ``claude-sonnet-4-5``). A
model with no entry is listed as unpriced, never guessed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from corral._errors import ConfigError

__all__ = ["PRICES_ENV", "Price", "default_prices", "load_prices", "price_usage"]

PRICES_ENV: Final = "CORRAL_PRICES"


@dataclass(frozen=True, slots=True)
class Price:
    """US dollars per million tokens of each kind."""

    input: float
    output: float
    cache_read: float = 0.0
    cache_write: float = 0.0


# List prices per million tokens, as the vendors publish them (check yours: $CORRAL_PRICES).
_DEFAULTS: Final = {
    "claude-opus-4": Price(15, 75, 1.5, 18.75),
    "claude-opus-4-5": Price(5, 25, 0.5, 6.25),
    "claude-sonnet-4": Price(3, 15, 0.3, 3.75),
    "claude-3-7-sonnet": Price(3, 15, 0.3, 3.75),
    "claude-haiku-4-5": Price(1, 5, 0.1, 1.25),
    "claude-3-5-haiku": Price(0.8, 4, 0.08, 1),
    "gpt-5": Price(1.25, 10, 0.125),
    "gpt-5-mini": Price(0.25, 2, 0.025),
    "gpt-4.1": Price(2, 8, 0.5),
    "gpt-4.1-mini": Price(0.4, 1.6, 0.1),
    "o4-mini": Price(1.1, 4.4, 0.275),
}


def default_prices() -> dict[str, Price]:
    """corral's own table (a copy)."""
    return dict(_DEFAULTS)


def load_prices(environ: Mapping[str, str] | None = None) -> dict[str, Price]:
    """corral's table with ``$CORRAL_PRICES``'s entries over it; raises
    :class:`~corral._errors.ConfigError` naming what is wrong with that file."""
    env = os.environ if environ is None else environ
    prices = default_prices()
    path = env.get(PRICES_ENV)
    if not path:
        return prices
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"${PRICES_ENV}: cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ConfigError(f"${PRICES_ENV}: {path} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"${PRICES_ENV}: {path} must hold an object of model -> prices")
    for model, entry in data.items():
        prices[model] = _price(model, entry, path)
    return prices


def _price(model: str, entry: Any, path: str) -> Price:
    fields = ("input", "output", "cache_read", "cache_write")
    if not isinstance(entry, dict) or not {"input", "output"} <= entry.keys() \
            or not entry.keys() <= set(fields):
        raise ConfigError(f"${PRICES_ENV}: {path}: {model!r} needs input and output (and may "
                          "have cache_read, cache_write), in dollars per million tokens")
    values = {k: entry.get(k, 0.0) for k in fields}
    for kind, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ConfigError(f"${PRICES_ENV}: {path}: {model!r} {kind} must be a number "
                              f">= 0, got {value!r}")
    return Price(*(float(values[k]) for k in fields))


def _lookup(model: str, prices: Mapping[str, Price]) -> Price | None:
    best = max((name for name in prices if model.startswith(name)), key=len, default=None)
    return prices[best] if best is not None else None


def price_usage(models: Mapping[str, Mapping[str, int]],
                prices: Mapping[str, Price]) -> dict[str, Any]:
    """The cost of per-model usage (the model proxy's ``models``): ``{"cost_usd": total of
    the priced models, "cost_by_model": {model: usd}, "unpriced": [models without a
    price]}``."""
    by_model: dict[str, float] = {}
    unpriced: list[str] = []
    for model, used in sorted(models.items()):
        price = _lookup(model, prices)
        if price is None:
            unpriced.append(model)
            continue
        usd = (used.get("input_tokens", 0) * price.input
               + used.get("output_tokens", 0) * price.output
               + used.get("cache_read_tokens", 0) * price.cache_read
               + used.get("cache_write_tokens", 0) * price.cache_write) / 1_000_000
        by_model[model] = round(usd, 6)
    return {"cost_usd": round(sum(by_model.values()), 6), "cost_by_model": by_model,
            "unpriced": unpriced}
