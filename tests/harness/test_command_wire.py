"""The command harness's wire twin (``wire_twin``, issue #17: a driver of a command run
imports no AG-UI models) makes exactly the dicts ``event_to_dict`` makes of the models the
public translator returns: same keys, same order, same values."""

from __future__ import annotations

import json
import signal

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.harness._base import RunContext
from corral.harness._command import CommandHarness, wire_twin
from corral.harness._events import event_to_dict
from corral.journal._reader import Exit, JournalItem, Line

CTX = RunContext("run-1", "thread-1")


def _both(harness: CommandHarness, items: list[JournalItem]) -> tuple[list[str], list[str]]:
    """Every event of the public translator (dumped) and of the twin's, as JSON text (so key
    order counts)."""
    twin = wire_twin(harness)
    assert twin is not None
    model, wire = harness.translator(CTX), twin.translator(CTX)
    dumped = [event_to_dict(e) for e in model.start()]
    made: list[object] = list(wire.start())
    for item in items:
        dumped += [event_to_dict(e) for e in model.feed(item)]
        made += list(wire.feed(item))
    assert all(isinstance(e, dict) for e in made)
    return [json.dumps(e) for e in dumped], [json.dumps(e) for e in made]


def _lines(chunks: list[bytes]) -> list[JournalItem]:
    items: list[JournalItem] = []
    offset = 0
    for data in chunks:
        offset += len(data) + 1
        items.append(Line(data, offset))
    return items


EXITS = [
    Exit(0, None, 0),
    Exit(1, None, 0, b"boom\n"),
    Exit(137, None, 0),
    Exit(128 + signal.SIGTERM, signal.SIGTERM, 0, b"\xff bad tail"),
    Exit(255, None, 0, b""),
]


def test_wire_events_equal_the_dumped_models() -> None:
    lines = _lines([b"hello", b"", "héllo ✓".encode(), b"\xff\xfe invalid", b"x" * 50])
    for exit in EXITS:
        model, wire = _both(CommandHarness(["true"], max_delta_chars=7), [*lines, exit])
        assert model == wire
        assert len(model) > 8


@settings(max_examples=60, deadline=None)
@given(chunks=st.lists(st.binary(max_size=30).filter(lambda b: b"\n" not in b), max_size=6),
       code=st.integers(0, 255), step=st.integers(1, 9))
def test_wire_events_equal_for_any_output(chunks: list[bytes], code: int, step: int) -> None:
    items = [*_lines(chunks), Exit(code, None, 0, b"tail")]
    model, wire = _both(CommandHarness(["true"], max_delta_chars=step), items)
    assert model == wire


def test_only_a_plain_command_harness_has_a_twin() -> None:
    class Mine(CommandHarness):
        pass

    assert wire_twin(Mine(["true"])) is None
    twin = wire_twin(CommandHarness(["a", "b"], max_delta_chars=3))
    assert twin is not None and twin.name == "command" and twin.resume == "offset"
