"""The docker provider's file helper runs as the agent's uid, so what it answers is hostile:
any reply (wrong JSON shape, wrong types, huge errno, junk bytes) becomes an ``OSError``
(or corral's path-escape error), never a host traceback (no docker daemon needed)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.providers._docker import _file_info, _fs_error, _json_answer

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=7),
    max_leaves=12,
)
info_like = st.fixed_dictionaries({k: json_values for k in
                                   ("path", "name", "type", "size", "mtime", "mode")})


@settings(max_examples=300)
@given(st.one_of(json_values, info_like))
def test_any_file_info_answer_is_a_file_info_or_an_os_error(answer: Any) -> None:
    try:
        info = _file_info(answer, "stat", "x")
    except OSError as exc:
        assert "malformed answer to stat" in str(exc)
    else:
        assert isinstance(info.size, int) and info.type in ("file", "dir", "symlink", "other")


@settings(max_examples=300)
@given(st.one_of(json_values.map(lambda v: json.dumps(v).encode()), st.binary(max_size=64)))
def test_any_error_answer_is_an_os_error(stderr: bytes) -> None:
    err = _fs_error("x", stderr)
    assert isinstance(err, OSError) and isinstance(err.errno, int)


def test_forged_answers_seen_in_review_are_refused() -> None:
    # These raised ValueError / TypeError / KeyError on the host before the shape checks.
    assert _fs_error("x", b'{"errno": "x", "msg": 1}').errno == 5
    assert _fs_error("x", b'[1, 2]').errno == 5
    with pytest.raises(OSError):
        _file_info({"path": "a", "name": "a", "type": "file", "size": 1, "mtime": 0,
                    "mode": 0, "extra": 1}, "stat", "x")
    with pytest.raises(OSError):
        _json_answer(b"\xff not json", "list", "x")
    good = {"path": "a", "name": "a", "type": "file", "size": 3, "mtime": 1.5, "mode": 420}
    assert _file_info(good, "stat", "x").size == 3
