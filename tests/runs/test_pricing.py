"""Pricing a run's per-model usage: longest-prefix lookup, the operator's table over corral's,
unpriced models listed (never guessed), and a bad price file named in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral._errors import ConfigError
from corral.runs._pricing import PRICES_ENV, Price, load_prices, price_usage


def used(inp: int = 0, out: int = 0, read: int = 0, write: int = 0) -> dict[str, int]:
    return {"input_tokens": inp, "output_tokens": out, "cache_read_tokens": read,
            "cache_write_tokens": write, "requests": 1}


def test_the_longest_matching_entry_prices_a_dated_model_name() -> None:
    prices = {"claude-opus-4": Price(15, 75), "claude-opus-4-5": Price(5, 25)}
    priced = price_usage({"claude-opus-4-5-20251101": used(1_000_000, 1_000_000),
                          "claude-opus-4-1-20250805": used(1_000_000)}, prices)
    assert priced["cost_by_model"] == {"claude-opus-4-5-20251101": 30.0,
                                       "claude-opus-4-1-20250805": 15.0}
    assert priced["cost_usd"] == 45.0 and priced["unpriced"] == []


def test_cache_tokens_have_their_own_prices() -> None:
    priced = price_usage({"m": used(read=2_000_000, write=1_000_000)},
                         {"m": Price(3, 15, 0.3, 3.75)})
    assert priced["cost_usd"] == pytest.approx(4.35)


def test_a_model_without_a_price_is_listed_not_guessed() -> None:
    priced = price_usage({"my-finetune": used(10, 10), "gpt-5-mini": used(1_000_000)},
                         load_prices({}))
    assert priced["unpriced"] == ["my-finetune"]
    assert set(priced["cost_by_model"]) == {"gpt-5-mini"}


def test_the_operators_file_replaces_and_adds_entries(tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"gpt-5": {"input": 1, "output": 2},
                                "my-finetune": {"input": 0.5, "output": 1, "cache_read": 0.1}}))
    prices = load_prices({PRICES_ENV: str(path)})
    assert prices["gpt-5"] == Price(1, 2) and prices["my-finetune"] == Price(0.5, 1, 0.1)
    assert "claude-sonnet-4" in prices  # corral's other entries stay


@pytest.mark.parametrize(("content", "says"), [
    ("not json", "is not JSON"),
    ("[1, 2]", "must hold an object"),
    (json.dumps({"m": {"input": 1}}), "'m' needs input and output"),
    (json.dumps({"m": {"input": 1, "output": 2, "reasoning": 3}}), "'m' needs input"),
    (json.dumps({"m": {"input": -1, "output": 2}}), "input must be a number >= 0"),
    (json.dumps({"m": {"input": True, "output": 2}}), "input must be a number >= 0"),
])
def test_a_bad_price_file_is_one_clear_error(tmp_path: Path, content: str, says: str) -> None:
    path = tmp_path / "prices.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match="CORRAL_PRICES") as err:
        load_prices({PRICES_ENV: str(path)})
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_missing_price_file_is_named() -> None:
    with pytest.raises(ConfigError, match="cannot read /nonexistent/prices.json"):
        load_prices({PRICES_ENV: "/nonexistent/prices.json"})


tokens = st.integers(min_value=0, max_value=10**9)


@given(st.dictionaries(st.sampled_from(["claude-sonnet-4-5", "gpt-5", "other", "o4-mini-x"]),
                       st.tuples(tokens, tokens, tokens, tokens), max_size=4))
def test_property_the_total_is_the_sum_of_the_priced_models(
        models: dict[str, tuple[int, int, int, int]]) -> None:
    usage = {m: used(*t) for m, t in models.items()}
    priced = price_usage(usage, load_prices({}))
    assert set(priced["cost_by_model"]) | set(priced["unpriced"]) == set(usage)
    assert not set(priced["cost_by_model"]) & set(priced["unpriced"])
    assert priced["cost_usd"] == pytest.approx(sum(priced["cost_by_model"].values()), abs=1e-5)
    assert all(v >= 0 for v in priced["cost_by_model"].values())


def test_show_never_prints_an_unpriced_model_as_free() -> None:
    from corral.cli._records import usage_lines

    usage = {"input_tokens": 10, "output_tokens": 5, "requests": 1, "cost_usd": 0.0,
             "cost_by_model": {}, "unpriced": ["house-model"],
             "models": {"house-model": {"input_tokens": 10, "output_tokens": 5}}}
    cost = [line for line in usage_lines(usage) if line.startswith("cost")]
    assert cost == [f"{'cost':17} unknown (no price for house-model)"]

    usage.update(cost_usd=0.25, cost_by_model={"claude-x": 0.25})
    cost = [line for line in usage_lines(usage) if line.startswith("cost")]
    assert cost == [f"{'cost':17} $0.2500 + unpriced: house-model"]
