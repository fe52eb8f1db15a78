"""The journal reader and tail probe on prepared files (no supervisor needed)."""

from __future__ import annotations

import io
import json
import os
import tempfile
import time
from pathlib import Path
from typing import BinaryIO

import anyio
import pytest
from hypothesis import assume, HealthCheck, given, settings
from hypothesis import strategies as st

from corral.journal._reader import (
    Exit,
    JournalAbandonedError,
    JournalError,
    JournalItem,
    Line,
    probe_journal_tail,
    read_journal,
)
from corral.journal._layout import JournalPaths, SupervisorStatus, encode_run_id, write_status
from corral.journal._sentinel import format_sentinel, format_trailer, parse_sentinel

from .conftest import run_async

NONCE = "a" * 32
OTHER = "b" * 32



class Counting(io.RawIOBase):
    """A file wrapper that counts the bytes its reads return."""

    def __init__(self, f: BinaryIO, counter: list[int]) -> None:
        self.f, self.counter = f, counter

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.counter[0] += len(data)
        return data

    def seek(self, pos: int, whence: int = 0) -> int:
        return self.f.seek(pos, whence)

    def close(self) -> None:
        self.f.close()
        super().close()


class Growing(io.RawIOBase):
    """An in-memory file revealed piece by piece: each read that hits the revealed end
    returns b"" once and reveals the next piece (what a follower sees of a growing file)."""

    def __init__(self, data: bytes, cuts: list[int]) -> None:
        self.data, self.cuts, self.pos = data, sorted(set(cuts)), 0
        self.limit = self.cuts.pop(0) if self.cuts else len(data)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        end = self.limit if n < 0 else min(self.limit, self.pos + n)
        out = self.data[self.pos : end]
        self.pos += len(out)
        if not out:
            self.limit = self.cuts.pop(0) if self.cuts else len(self.data)
        return out

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = pos if whence == 0 else (self.limit + pos if whence == 2 else self.pos + pos)
        return self.pos


def items_of(target: object, **kw: object) -> list[JournalItem]:
    async def go() -> list[JournalItem]:
        out: list[JournalItem] = []
        with anyio.fail_after(20):
            async for item in read_journal(target, **kw):  # type: ignore[arg-type]
                out.append(item)
        return out

    return run_async(go)


def split(items: list[JournalItem]) -> tuple[list[Line], Exit | None]:
    lines = [i for i in items if isinstance(i, Line)]
    exits = [i for i in items if isinstance(i, Exit)]
    assert len(exits) <= 1 and (not exits or items[-1] is exits[0])
    return lines, exits[0] if exits else None


# ---------------------------------------------------------------- sentinel


def test_sentinel_roundtrip_and_rejections() -> None:
    key = NONCE.encode()
    assert parse_sentinel(format_sentinel(NONCE, 0, None), key).code == 0  # type: ignore[union-attr]
    hit = parse_sentinel(format_sentinel(NONCE, 137, 9), key)
    assert hit is not None and (hit.code, hit.signal) == (137, 9)
    good = format_sentinel(NONCE, 3, None)
    for bad in (
        format_sentinel(OTHER, 3, None),
        good + b" ",
        b" " + good,
        good.replace(b'"code":3', b'"code":3.0'),
        good.replace(b'"code":3', b'"code":true'),
        good.replace(b'"code":3', b'"code":"3"'),
        good.replace(b'"code":3', b'"code":-3'),
        good.replace(b'"code":3', b'"code":03'),
        good.replace(NONCE.encode(), NONCE.upper().encode()),
        good.replace(b'"signal":null', b'"signal":0'),
        good[:-1],
        good + b"\r",
    ):
        assert parse_sentinel(bad, key) is None, bad


def test_encode_run_id_is_safe_and_injective() -> None:
    names = ["a", "A", "a_b", "a.b", "a/b", "..", ".hidden", "é", "_2f", "x" * 500, "x" * 501]
    tokens = [encode_run_id(n) for n in names]
    assert len(set(tokens)) == len(tokens)
    for t in tokens:
        assert "/" not in t and not t.startswith(".") and len(t) <= 120
    with pytest.raises(ValueError):
        encode_run_id("")


# ---------------------------------------------------------------- reader basics


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_reads_lines_then_exit_and_ignores_what_follows(tmp_path: Path) -> None:
    j = write(tmp_path / "j", b"a\nb" + format_trailer(NONCE, 2, None) + b"late\n")
    lines, exit = split(items_of(j, nonce=NONCE, follow=False))
    assert [line.data for line in lines] == [b"a", b"b"]
    assert [line.end_offset for line in lines] == [2, 4]
    assert exit is not None and exit.code == 2 and exit.end_offset == len(j.read_bytes()) - 5


def test_no_partial_line_without_sentinel(tmp_path: Path) -> None:
    j = write(tmp_path / "j", b"a\npartial")
    lines, exit = split(items_of(j, nonce=NONCE, follow=False))
    assert [line.data for line in lines] == [b"a"] and exit is None


def test_without_a_nonce_no_exit_is_recognised(tmp_path: Path) -> None:
    j = write(tmp_path / "j", b"a" + format_trailer(NONCE, 0, None))
    lines, exit = split(items_of(j, nonce=None, follow=False))
    assert exit is None and lines[-1].data == format_sentinel(NONCE, 0, None)


def test_resume_offset_must_be_a_line_boundary(tmp_path: Path) -> None:
    j = write(tmp_path / "j", b"abc\ndef\n")
    with pytest.raises(JournalError, match="line boundary"):
        items_of(j, nonce=NONCE, follow=False, after=2)
    with pytest.raises(JournalError, match="non-negative"):
        items_of(j, nonce=NONCE, follow=False, after=-1)
    with pytest.raises(ValueError, match="32 lowercase hex"):
        items_of(j, nonce="xyz", follow=False)
    assert [i.data for i in items_of(j, nonce=NONCE, follow=False, after=4)] == [b"def"]  # type: ignore[union-attr]


def test_missing_file_nonfollow_yields_nothing(tmp_path: Path) -> None:
    assert items_of(tmp_path / "absent", nonce=NONCE, follow=False) == []


def test_follow_waits_for_the_file_and_for_growth(tmp_path: Path) -> None:
    j = tmp_path / "j"

    async def go() -> list[JournalItem]:
        out: list[JournalItem] = []
        with anyio.fail_after(20):
            reader = read_journal(j, nonce=NONCE, poll=0.01)
            j.write_bytes(b"")
            got_first = anyio.Event()

            async def writer() -> None:
                with open(j, "ab") as f:  # noqa: ASYNC230 - tiny local writes
                    f.write(b"first\nsec")
                    f.flush()
                    await got_first.wait()
                    f.write(b"ond" + format_trailer(NONCE, 0, None))

            async with anyio.create_task_group() as tg:
                tg.start_soon(writer)
                async for item in reader:
                    out.append(item)
                    got_first.set()
        return out

    lines, exit = split(run_async(go))
    assert [line.data for line in lines] == [b"first", b"second"] and exit is not None


def test_follow_raises_when_supervisor_is_gone_without_sentinel(tmp_path: Path) -> None:
    paths = JournalPaths.for_run(tmp_path, "r")
    paths.journal.write_bytes(b"out\n")
    # A status naming a process that is certainly not ours (start time 1).
    write_status(paths.status, SupervisorStatus("running", os.getpid(), 1, None, None))
    with pytest.raises(JournalAbandonedError, match="no exit sentinel"):
        items_of(paths, nonce=NONCE, liveness_interval=0.05, poll=0.01)


# ---------------------------------------------------------------- properties

agent_bytes = st.lists(
    st.one_of(
        st.binary(max_size=40),
        st.just(b"\n"),
        st.sampled_from([format_sentinel(OTHER, 0, None), format_sentinel(NONCE, 0, None)[:-2],
                         b'{"corral_exit":1,"code":0', format_trailer(OTHER, 1, 9)]),
    ),
    max_size=25,
).map(b"".join)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    agent=agent_bytes,
    code=st.integers(0, 255),
    late=st.binary(max_size=30),
    cut_fracs=st.lists(st.floats(0, 1), max_size=8),
    chunk=st.integers(1, 64),
)
def test_property_lines_reassemble_exactly_and_only_the_real_sentinel_counts(
    agent: bytes, code: int, late: bytes, cut_fracs: list[float], chunk: int
) -> None:
    # The agent never sees the nonce (that is what the hostile-agent tests check); here the
    # generator can assemble it from the truncated sample plus random bytes.
    assume(NONCE.encode() not in agent)
    data = agent + format_trailer(NONCE, code, None) + late + format_trailer(NONCE, 99, None)
    cuts = [int(f * len(data)) for f in cut_fracs]
    items = items_of(Path("/unused"), nonce=NONCE, poll=0.002, chunk_size=chunk,
                     opener=lambda _p: Growing(data, cuts))  # type: ignore[arg-type,return-value]
    lines, exit = split(items)
    assert exit is not None and exit.code == code
    assert b"\n".join(line.data for line in lines) == agent
    assert exit.end_offset == len(agent) + len(format_trailer(NONCE, code, None))
    for line in lines:  # every offset is just past a newline of the journal
        assert data[line.end_offset - 1 : line.end_offset] == b"\n"
        assert data[line.start_offset : line.end_offset - 1] == line.data


@settings(max_examples=60, deadline=None)
@given(agent=agent_bytes, code=st.integers(0, 255), data=st.data())
def test_property_resuming_at_any_yielded_offset_gives_the_same_tail(
    agent: bytes, code: int, data: st.DataObject
) -> None:
    with tempfile.TemporaryDirectory() as d:
        j = write(Path(d) / "j", agent + format_trailer(NONCE, code, None))
        full = items_of(j, nonce=NONCE, follow=False)
        k = data.draw(st.integers(0, len(full) - 1))
        offset = 0 if k == 0 else full[k - 1].end_offset
        assert items_of(j, nonce=NONCE, follow=False, after=offset) == full[k:]


# ---------------------------------------------------------------- big journal


def test_attaching_near_the_end_of_a_1gb_journal_reads_only_the_tail(tmp_path: Path) -> None:
    j = tmp_path / "big.journal"
    size = 1 << 30
    tail = b"\n" + b"near the end\nlast" + format_trailer(NONCE, 0, None)
    with open(j, "wb") as f:
        f.truncate(size)  # sparse: 1 GiB of agent bytes in no time
        f.seek(size)
        f.write(tail)
    after = size + 1
    counter = [0]

    def opener(p: Path) -> BinaryIO:
        return Counting(open(p, "rb", buffering=0), counter)  # type: ignore[return-value]

    lines, exit = split(items_of(j, nonce=NONCE, follow=True, after=after, opener=opener))
    assert [line.data for line in lines] == [b"near the end", b"last"]
    assert exit is not None and exit.code == 0
    assert counter[0] == 1 + len(tail) - 1  # the boundary byte, then only what follows it

    counter[0] = 0
    probe = probe_journal_tail(j, NONCE, opener=opener, max_bytes=4096)
    assert probe.state == "finished" and counter[0] <= 4096


# ---------------------------------------------------------------- probe


def test_probe_states(tmp_path: Path) -> None:
    paths = JournalPaths.for_run(tmp_path, "r")
    assert probe_journal_tail(paths, NONCE).state == "unknown"  # nothing at all
    paths.journal.write_bytes(b"working\n")
    recent = probe_journal_tail(paths, NONCE)
    assert recent.state == "producing"
    stale = probe_journal_tail(paths, NONCE, now=time.time() + 3600)
    assert stale.state == "unknown" and "no exit sentinel" in stale.reason
    # A live supervisor makes a stale journal "producing".
    me = json.loads(json.dumps({"pid": os.getpid()}))["pid"]
    from corral.journal._supervisor import process_start_time

    write_status(paths.status, SupervisorStatus("running", me, process_start_time(me) or 0,
                                                None, None))
    assert probe_journal_tail(paths, NONCE, now=time.time() + 3600).state == "producing"
    # Forged sentinels never finish a run.
    with open(paths.journal, "ab") as f:
        f.write(format_trailer(OTHER, 0, None))
    assert probe_journal_tail(paths, NONCE).state == "producing"
    with open(paths.journal, "ab") as f:
        f.write(format_trailer(NONCE, 3, None))
    assert probe_journal_tail(paths, NONCE).code == 3
    assert probe_journal_tail(paths, "not a nonce").state == "unknown"


def test_probe_uses_the_trailer_hint_when_stragglers_pushed_the_sentinel_out(
    tmp_path: Path,
) -> None:
    paths = JournalPaths.for_run(tmp_path, "r")
    head = b"agent output\n"
    trailer = format_trailer(NONCE, 4, None)
    paths.journal.write_bytes(head + trailer + b"x" * 100_000 + format_trailer(NONCE, 0, None))
    assert probe_journal_tail(paths.journal, NONCE).code == 0  # no status: tail window only
    write_status(paths.status, SupervisorStatus("exited", 1, 1, None, None, 4, None, len(head)))
    counter = [0]

    def opener(p: Path) -> BinaryIO:
        return Counting(open(p, "rb", buffering=0), counter)  # type: ignore[return-value]

    probe = probe_journal_tail(paths, NONCE, opener=opener)
    assert (probe.state, probe.code) == ("finished", 4)
    assert counter[0] <= 65536  # read from the hint, not the whole file
