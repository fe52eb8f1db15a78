"""The supervisor's stream redactor: secrets never reach the journal, however output is cut."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.journal._supervise import StreamRedactor
from corral.sandbox._redact import Redactor

SECRETS = {"TOKEN": "s3cr3t-T0KEN-value", "KEY": "line1\nline2-key"}


def run(table: dict[str, str], chunks: list[bytes]) -> bytes:
    r = StreamRedactor(table)
    return b"".join(r.feed(c) for c in chunks) + r.flush()


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(
        st.one_of(st.binary(max_size=30), st.sampled_from([v.encode() for v in SECRETS.values()]),
                  st.just(b"\n")),
        max_size=20,
    ),
    cuts=st.lists(st.integers(0, 400), max_size=10),
)
def test_chunking_never_changes_the_redacted_output(parts: list[bytes], cuts: list[int]) -> None:
    redactor = Redactor(SECRETS)
    table = redactor.table()
    data = b"".join(parts)
    points = sorted({c for c in cuts if c <= len(data)})
    chunks, last = [], 0
    for p in points:
        chunks.append(data[last:p])
        last = p
    chunks.append(data[last:])
    out = run(table, chunks)
    assert out == redactor.redact_bytes(data)
    for value in SECRETS.values():
        assert value.encode() not in out


def test_complete_lines_are_not_held_back() -> None:
    r = StreamRedactor(Redactor({"TOKEN": "s3cr3t-T0KEN-value"}).table())
    assert r.feed(b"hello\n") == b"hello\n"
    assert r.feed(b"x s3cr3t-T0KEN-value y\n") == b"x [REDACTED:TOKEN] y\n"
    held = r.feed(b"partial s3cr3t")  # could be the start of the secret: held back
    assert b"s3cr3t" not in held
    assert held + r.feed(b"-T0KEN-value!\n") + r.flush() == b"partial [REDACTED:TOKEN]!\n"
