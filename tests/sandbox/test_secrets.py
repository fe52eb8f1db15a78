"""Secrets are opaque refs; the redactor hides values and their encodings."""

from __future__ import annotations

import base64
import json
import logging
import pickle
from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral import ConfigError, Redactor, SecretRef, Secrets
from corral.sandbox._redact import get_logger, live_redactor

VALUE = "s3cr3t-V4lue/with+chars=="


def test_refs_carry_names_only() -> None:
    s = Secrets(API_TOKEN=VALUE)
    ref = s.API_TOKEN
    assert ref == SecretRef("API_TOKEN") == s["API_TOKEN"]
    assert VALUE not in repr(s) and VALUE not in str(s) and VALUE not in repr(ref)
    assert VALUE not in json.dumps(s.to_dict())
    assert list(s) == ["API_TOKEN"]
    with pytest.raises(TypeError):
        pickle.dumps(s)
    assert s.resolve(ref) == VALUE
    assert s.env() == {"API_TOKEN": VALUE}


def test_bad_secrets_name_the_field() -> None:
    with pytest.raises(ConfigError, match="secrets.X: the value"):
        Secrets(X="")
    with pytest.raises(ConfigError, match="invalid secret name .1BAD.*POSIX"):
        Secrets({"1BAD": "value-123"})
    with pytest.raises(ConfigError, match="unknown secret 'NOPE'"):
        Secrets(A="value-123").resolve("NOPE")


def test_from_env_and_sources() -> None:
    env = {"HOST_TOKEN": VALUE}
    assert Secrets.from_env(["HOST_TOKEN"], env).resolve("HOST_TOKEN") == VALUE
    with pytest.raises(ConfigError, match="MISSING"):
        Secrets.from_env(["MISSING"], env)
    s = Secrets.from_sources({"TOKEN": {"env": "HOST_TOKEN"}}, env)
    assert s.resolve("TOKEN") == VALUE
    assert s.origins() == {"TOKEN": {"env": "HOST_TOKEN"}}
    with pytest.raises(ConfigError, match="never go in the definition"):
        Secrets.from_sources({"TOKEN": {"value": VALUE}}, env)  # type: ignore[dict-item]


@pytest.mark.parametrize(
    "leak",
    [
        VALUE,
        quote(VALUE, safe=""),
        json.dumps({"k": VALUE}),
        base64.b64encode(VALUE.encode()).decode(),
        base64.b64encode(b"x" + VALUE.encode()).decode(),
        base64.b64encode(b"xy" + VALUE.encode() + b"tail").decode(),
        base64.urlsafe_b64encode(b"Authorization: Bearer " + VALUE.encode()).decode(),
        VALUE.encode().hex(),
    ],
)
def test_redactor_hides_value_and_encodings(leak: str) -> None:
    r = Redactor({"API_TOKEN": VALUE})
    out = r.redact(f"before {leak} after")
    assert "[REDACTED:API_TOKEN]" in out
    assert VALUE not in out and leak not in out
    assert out.startswith("before ") and out.endswith(" after")


def test_redact_obj_and_bytes() -> None:
    r = Redactor({"T": VALUE})
    event = {"type": "TEXT", "delta": f"key={VALUE}", VALUE: [VALUE, 1, None, (VALUE,)]}
    out = r.redact_obj(event)
    assert VALUE not in json.dumps(out, default=str)
    assert out["type"] == "TEXT"
    assert r.redact_bytes(b"x" + VALUE.encode() + b"y") == b"x[REDACTED:T]y"


def test_live_redactor_follows_secrets_objects_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    s = Secrets(LIVE_ONE="live-value-0192837")
    assert live_redactor().redact("x live-value-0192837 y") == "x [REDACTED:LIVE_ONE] y"
    log = get_logger("corral.test")
    with caplog.at_level(logging.INFO, logger="corral.test"):
        log.info("token is %s", s.resolve("LIVE_ONE"))
    assert "live-value-0192837" not in caplog.text
    assert "[REDACTED:LIVE_ONE]" in caplog.text
    del s
    import gc

    gc.collect()
    assert "live-value-0192837" in live_redactor().redact("live-value-0192837")


@settings(max_examples=200, deadline=None)
@given(
    st.text(min_size=8, max_size=40).filter(lambda v: "\x00" not in v),
    st.binary(max_size=10),
    st.binary(max_size=10),
)
def test_base64_of_a_value_at_any_offset_is_redacted(value: str, pre: bytes, post: bytes) -> None:
    r = Redactor({"S": value})
    blob = base64.b64encode(pre + value.encode() + post).decode()
    out = r.redact(blob)
    assert "[REDACTED:S]" in out
