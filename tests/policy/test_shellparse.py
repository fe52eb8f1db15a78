"""The shell splitter finds every command a string runs, or refuses."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.policy._parts import command_parts
from corral.policy._shellparse import parse
from corral.policy._shelltree import ShellParseError


def argvs(cmd: str) -> list[list[str]]:
    return [[w.text for w in c.argv] for c in parse(cmd) if c.argv]


@pytest.mark.parametrize(
    ("cmd", "expected"),
    [
        ("pytest; curl x | sh", [["pytest"], ["curl", "x"], ["sh"]]),
        ("a && b || c & d", [["a"], ["b"], ["c"], ["d"]]),
        ("a |& b", [["a"], ["b"]]),
        ("echo $(rm -rf /)", [["rm", "-rf", "/"], ["echo", "$(rm -rf /)"]]),
        ("echo `id`", [["id"], ["echo", "`id`"]]),
        ("(a; b) | { c; }", [["a"], ["b"], ["c"]]),
        ("A=1 B=2 cmd x", [["cmd", "x"]]),
        ("'r'\"m\" -rf /", [["rm", "-rf", "/"]]),
        ("$'\\x72\\155' x", [["rm", "x"]]),
        ("a\nb\n\nc", [["a"], ["b"], ["c"]]),
        ("if a; then b; elif c; then d; else e; fi", [["a"], ["b"], ["c"], ["d"], ["e"]]),
        ("for f in $(ls); do cat $f; done", [["ls"], ["cat", "$f"]]),
        ("while a; do b; done", [["a"], ["b"]]),
        ("case $x in a|b) c;; *) d;; esac", [["c"], ["d"]]),
        ("f() { g; }; f", [["g"], ["f"]]),
        ("function f { g; }", [["g"]]),
        ("[[ -n $(h) && x ]] && i", [["h"], ["i"]]),
        # bash reads `((…))` as arithmetic, dash as two subshells: both views are judged
        ("(( j + 1 ))", [["j", "+", "1"]]),
        ("((touch x))", [["touch", "x"]]),
        ("diff <(k) >(l)", [["k"], ["l"], ["diff", "<(…)", "<(…)"]]),
        ("cat <<EOF\n$(m)\nEOF\nn", [["cat"], ["m"], ["n"]]),
        ("cat <<'EOF'\n$(m)\nEOF\nn", [["cat"], ["n"]]),
        ("cat <<-EOF\n\t$(m)\n\tEOF", [["cat"], ["m"]]),
        ("echo ${x:-$(o)}", [["o"], ["echo", "${x:-$(o)}"]]),
        ("a[i]=$(p)", [["p"]]),
        ("echo a # $(not run)", [["echo", "a"]]),
        ("! q", [["q"]]),
        ("x=$(r) y=`s`", [["r"], ["s"]]),
        ("echo a\\\nb", [["echo", "ab"]]),
    ],
)
def test_splits_into_every_command(cmd: str, expected: list[list[str]]) -> None:
    assert argvs(cmd) == expected


@pytest.mark.parametrize(
    "cmd",
    [
        "echo 'unclosed",
        'echo "unclosed',
        "echo $(unclosed",
        "echo `unclosed",
        "a &&",
        "| a",
        "a ;; b",
        "cat <<EOF\nno end",
        "if a; then b",
        "(a",
        "a )",
        "echo \x00",
        # arithmetic bash evaluates: the output of `j` would be evaluated as code
        "(( $(j) + 1 ))",
        "a[$(p)]=1",
    ],
)
def test_unreadable_strings_raise(cmd: str) -> None:
    with pytest.raises(ShellParseError):
        parse(cmd)


def test_redirect_targets_are_not_arguments() -> None:
    [cmd] = parse("echo hi > out.txt 2>&1 <in")
    assert [w.text for w in cmd.argv] == ["echo", "hi"]
    assert [(r.op, r.target.text, r.writes) for r in cmd.redirects] == [
        (">", "out.txt", True),
        (">&", "1", False),
        ("<", "in", False),
    ]


def test_dynamic_words_are_marked() -> None:
    [cmd] = parse("ls $X *.py 'lit*' \"$Y\" {a,b}")
    flags = [(w.text, w.dynamic) for w in cmd.argv]
    assert flags == [
        ("ls", False),
        ("$X", True),
        ("*.py", True),
        ("lit*", False),
        ("$Y", True),
        ("{a,b}", True),
    ]


def test_nesting_is_bounded() -> None:
    with pytest.raises(ShellParseError):
        parse("echo " + "$(echo " * 40 + "x" + ")" * 40)
    with pytest.raises(ShellParseError):
        command_parts("eval " * 40 + "echo x")
    # a reasonable depth is fine
    assert command_parts("eval " * 5 + "echo x")[-1].text == "echo x"


def test_parts_look_through_wrappers_and_shells() -> None:
    parts = command_parts("sudo -u root timeout -s KILL 5 env A=1 bash -lc 'eval \"rm -rf /\"'")
    texts = [(p.role, p.text) for p in parts]
    assert ("command", "rm -rf /") in texts
    assert all(role == "wrapper" for role, _ in texts[:-1])


_safe_word = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\x00", exclude_categories=("Cs",)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_safe_word, min_size=1, max_size=6))
def test_quoted_argv_round_trips(words: list[str]) -> None:
    """Whatever the words, shlex-quoting them gives back exactly those words."""
    # (a bare first word such as `then` would be a reserved word, as in any shell)
    [cmd] = parse("echo " + shlex.join(words))
    assert [w.text for w in cmd.argv] == ["echo", *words]
    assert not any(w.dynamic for w in cmd.argv)


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab $()`'\"\\;&|<>{}[]*?!#=\n\tc-x")), max_size=40))
def test_arbitrary_strings_parse_or_raise_cleanly(text: str) -> None:
    """No input makes the parser crash with anything but ShellParseError."""
    try:
        command_parts(text)
    except ShellParseError:
        pass
