"""One duration parser everywhere (issue #31, item 8): the CLI's ``--timeout``, ``--ttl`` and
``--reap-interval``, the definition files' ``keep_alive`` and ``timeout``, and the HTTP API's
``timeout`` all read ``10m`` the same way, and all refuse the same text with the same words."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral._durations import parse_duration
from corral._errors import ConfigError
from corral.cli._main import build_parser
from corral._validate import duration
from corral.server._models import StartRun

UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("10m", 600.0), ("90", 90.0), ("1h30m", 5400.0), ("500ms", 0.5), ("2d", 172800.0),
     (" 1.5h ", 5400.0), ("1H", 3600.0)],
)
def test_every_reader_agrees(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds
    assert duration(text, "lifecycle.keep_alive") == seconds
    assert StartRun(thread_id="t", command=["true"], timeout=text).timeout == seconds
    for argv in (["run", "--timeout", text, "--", "true"], ["exec", "--timeout", text, "--", "true"]):
        assert build_parser().parse_args(argv).timeout == seconds


@pytest.mark.parametrize("text", ["10x", "m", "", "1 0m", "-5s", "ten"])
def test_every_reader_refuses_the_same_text(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="use a number of seconds or a number with a unit"):
        parse_duration(text)
    with pytest.raises(ConfigError, match="keep_alive"):
        duration(text, "keep_alive")
    with pytest.raises(ValueError, match="number with a unit"):
        StartRun(thread_id="t", command=["true"], timeout=text)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", f"--timeout={text}", "--", "true"])
    err = capsys.readouterr().err
    assert err.endswith(f"corral run: error: argument --timeout: invalid --timeout {text!r}: "
                        "use a number of seconds or a number with a unit, e.g. 30s, 10m, 2h, "
                        "7d or 1h30m\n")


def test_a_zero_timeout_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--timeout", "0s", "--", "true"])
    assert capsys.readouterr().err.endswith(
        "corral run: error: argument --timeout: invalid --timeout '0s': must be more than 0\n")


@given(st.lists(st.tuples(st.integers(0, 999), st.sampled_from(sorted(UNITS))), min_size=1,
                max_size=4))
def test_a_sum_of_parts_is_the_sum(parts: list[tuple[int, str]]) -> None:
    text = "".join(f"{n}{u}" for n, u in parts)
    assert parse_duration(text) == pytest.approx(sum(n * UNITS[u] for n, u in parts))


@given(st.text(max_size=12))
def test_any_text_parses_or_says_what_to_write(text: str) -> None:
    try:
        seconds = parse_duration(text)
    except ConfigError as exc:
        assert "\n" not in str(exc) and "e.g. 30s" in str(exc) or "10 years" in str(exc)
    else:
        assert 0 <= seconds <= 10 * 365 * 86400
