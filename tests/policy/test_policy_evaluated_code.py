"""Attack tests: what bash evaluates as code where the parser saw only data.

bash runs command substitutions found in arithmetic (``$((…))``, ``$[…]``, ``((…))``,
``let``, the operands of ``[[ a -eq b ]]``, substring offsets), in array subscripts
anywhere (also inside a *value* evaluated later: ``x='a[$(id)]'; echo $((x))``), in names
given to ``read``/``printf -v``/``test -v``/``declare``/…, and in the ``@P`` transform.
Each string below ran ``pwned`` under bash (see ``test_policy_differential.py``, which
runs them) while the policy judged it ``echo`` only. Each must now be ``unparseable``.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.policy._parts import command_parts
from corral.policy._policy import Policy
from corral.policy._shellparse import parse
from corral.policy._shelltree import ShellParseError

# the builtins that take names or arithmetic are allowed on purpose: a rule allowing
# `read *` must not allow `read 'a[$(pwned)]'`
POLICY = Policy(
    allow=("echo *", "printf *", "read *", "mapfile *", "readarray *", "getopts *",
           "declare *", "typeset *", "local *", "export *", "readonly *", "unset *",
           "let *", "test *", "[ *", "true", ": *", "wait *", "cat *", "ls *"),
    default="deny",
)
P = "$(pwned)"

BYPASSES = [
    # arithmetic: single quotes are literal there, the substitution runs
    f"echo $(( '{P}' ))",
    f"echo $(( a['{P}'] ))",
    f"echo $[ '{P}' ]",
    f"echo $[ a['{P}'] ]",
    f"(( a['{P}'] ))",
    f"(( '{P}' ))",
    f"for (( i = '{P}'; i < 1; i++ )); do echo; done",
    # a value holding a subscripted name, evaluated later
    f"x='a[{P}]'; echo $((x))",
    f"x='a[{P}]'; echo $(($x))",
    f"x='a[{P}]'; echo \"$(( x + 1 ))\"",
    f"x='a[{P}]'; echo $[x]",
    f"x='a[{P}]'; (( x ))",
    f"x='a[{P}]'; for ((i=0; i<x; i++)); do :; done",
    f"x='a[{P}]'; [[ x -eq 1 ]]",
    f"x='a[{P}]'; [[ $x -eq 1 ]] && echo",
    f"x='a[{P}]'; [[ 1 -eq 1 && \"$x\" -gt 0 ]]",
    f"x='a[{P}]'; [[ ! $x -gt 0 ]]",
    f"x='a[{P}]'; echo ${{!x}}",
    f"x='a[{P}]'; echo ${{b[x]}}",
    f"x='a[{P}]'; echo ${{b[$x]:-z}}",
    f"x='a[{P}]'; echo ${{y:-$((x))}}",
    f"x='a[{P}]'; b[x]=1",
    f"x='a[{P}]'; b+=([x]=1)",
    f"x=abc; y='a[{P}]'; echo ${{x:y}}",
    f"x=abc; y='a[{P}]'; echo ${{x:0:y}}",
    f"x='a[{P}]'; for y in \"$x\"; do echo $((y)); done",
    "read y; echo $((y))",
    "read -r y < f; [[ $y -gt 1 ]] && echo big",
    f"printf -v y %s 'a[{P}]'; echo $((y))",
    "mapfile -t m < f; echo $(( m[0] ))",
    f"getopts a: o -a 'a[{P}]'; echo $((OPTARG))",
    f"f() {{ local n=$1; echo $((n + 1)); }}; f 'a[{P}]'",
    f"export x='a[{P}]'; bash -c 'echo $((x))'",
    f"[[ 'a[{P}]' -eq 1 ]]",
    f"[[ -v 'a[{P}]' ]] && echo",
    f"x='a[{P}]'; [[ -v $x ]]",
    f"[[ -R 'a[{P}]' ]]",
    f"x='a[{P}]'; [[ -v b[x] ]]",
    f"test -v 'a[{P}]'",
    f"[ -v 'a[{P}]' ]",
    f"x='a[{P}]'; [ -v \"$x\" ]",
    f"echo ${{a['{P}']}}",
    f"echo \"${{a['{P}']}}\"",
    f"x=abc; echo ${{x:'{P}'}}",
    "echo $((`pwned`))",
    # names given to builtins
    f"printf -v 'a[{P}]' x",
    f"read 'a[{P}]'",
    f"echo x | read 'a[{P}]'",
    f"read -a 'a[{P}]'",
    f"mapfile 'a[{P}]'",
    f"readarray -t 'a[{P}]' < f",
    f"mapfile -C '{P} #' -c 1 a < f",
    f"getopts a 'a[{P}]' -a",
    f"let 'a[{P}]'",
    f"let x='a[{P}]'",
    f"declare -n r='a[{P}]'; echo $r",
    f"declare -n r='a[{P}]'; r=1",
    f"declare -n r=x; x='a[{P}]'; echo $((r))",
    f"declare 'a[{P}]=1'",
    f"declare -a 'a[{P}]=1'",
    f"typeset 'a[{P}]=1'",
    f"local 'a[{P}]'=1",
    f"export 'a[{P}]=1'",
    f"readonly 'a[{P}]=1'",
    f"declare -i x; x='a[{P}]'",
    f"declare -i x='a[{P}]'",
    f"unset 'a[{P}]'",
    f"wait -p 'a[{P}]'",
    "n=PATH; read \"$n\"; ls",
    "declare \"$n\"=x",
    # assignment words whose subscript bash reads with quotes
    f"a['{P}']=1",
    f"a['{P}']+=1",
    f"a=(['{P}']=1)",
    f"a=( [1]=x ['{P}']=1 )",
    # assigning to these variables evaluates the value
    f"RANDOM='a[{P}]'",
    f"SRANDOM='a[{P}]'",
    f"OPTIND='a[{P}]'",
    f"HISTCMD='a[{P}]'",
    "read OPTIND < f",
    # variables bash sets from the string's own text or data
    f"echo 'a[{P}]'; echo $((_))",
    f"[[ \"a[{P}]\" =~ (.*) ]]; echo $(( BASH_REMATCH[1] ))",
    "select x in a; do echo $((REPLY)); done < f",
    # a {name} redirection naming an array element
    f"{{a['{P}']}}>/dev/null echo",
    # the prompt transform runs substitutions in the value
    f"x='{P}'; echo ${{x@P}}",
    "echo ${x@P}",
]


@pytest.mark.parametrize("command", BYPASSES)
def test_code_bash_evaluates_is_unparseable(command: str) -> None:
    decision = POLICY.evaluate(command)
    assert decision.verdict == "deny" and decision.rule == "unparseable", decision.explain()
    assert "pwned" not in decision.reason or "cannot read" in decision.reason


# trap's action, a completion command and a key binding are code bash runs later
LATER = ["trap 'rm -rf /' EXIT", "trap -- 'rm x' INT TERM", "trap \"$(echo rm) x\" EXIT",
         "f() { trap 'rm x' RETURN; }; f", "eval \"trap 'rm x' EXIT\"",
         "complete -C 'rm x' ls", "bind -x '\"\\C-x\": rm x'", "compgen -F f"]


@pytest.mark.parametrize("command", LATER)
def test_code_a_builtin_runs_later_is_judged_or_unparseable(command: str) -> None:
    lax = Policy(default="allow", deny=("rm *",))
    decision = lax.evaluate(command)
    assert decision.verdict == "deny", decision.explain()


@pytest.mark.parametrize("command", ["trap - EXIT", "trap '' INT", "trap -l", "trap -p EXIT",
                                     "trap 'echo bye' EXIT", "trap EXIT"])
def test_plain_traps_are_judged_as_what_they_run(command: str) -> None:
    lax = Policy(default="allow", deny=("rm *",))
    assert lax.evaluate(command).verdict == "allow", lax.evaluate(command).explain()


# names assigned by builtins change what later parts run, like `export PATH=…`
TAINTS = [
    "printf -v PATH %s /tmp/evil; ls",
    "read PATH < f; ls",
    "read -r -a PATH < f; ls",
    "mapfile -t PATH < f; ls",
    "readarray PATH < f; ls",
    "getopts p: PATH; ls",
    "wait -n -p PATH; ls",
    "unset PATH; ls",
    "for PATH in /tmp; do ls; done",
    "select PATH in /tmp; do ls; done",
    "let PATH=1; ls",
    "(( PATH = 1 )); ls",
    "echo $(( IFS = 1 )); ls",
    "declare -x BASH_ENV=/tmp/x; ls",
    # the part that runs again after the assignment comes first in the text
    "while true; do ls; read PATH || break; done",
    "f() { ls; }; read PATH; f",
]


@pytest.mark.parametrize("command", TAINTS)
def test_builtins_that_assign_taint_later_parts(command: str) -> None:
    decision = POLICY.evaluate(command)
    assert not decision.allowed, decision.explain()
    ls = [d for d in decision.parts if d.part.startswith("ls") or d.part == "f"]
    assert ls and all(not d.allowed for d in ls), decision.explain()


# what agents write every day is still judged normally
ORDINARY = [
    "[[ -f x ]] && echo ok",
    "for i in 1 2 3; do echo $i; done",
    "for i in {1..5}; do echo $((i * 2)); done",
    "i=0; while (( i < 3 )); do echo $i; (( i++ )) || true; done",
    "echo $(( 1 + 2 * 3 ))",
    "echo $((16#ff)) $((0x1f)) $(( 2 ** 8 ))",
    "n=3; echo $(( n - 1 ))",
    "echo $(( ${#x} + $# + $? ))",
    "echo ${#a[@]} ${a[0]} ${a[@]} ${a[*]:1:2} ${x:1} ${x: -1} ${x:i:2}",
    "[[ $# -gt 0 ]] && echo args",
    "[[ ${#a[@]} -eq 0 ]] && echo empty",
    "[[ $x == y* && -n $z ]] && echo match",
    "[ \"$x\" -eq 1 ] && echo one",
    "test -v HOME && echo set",
    "[[ -v HOME ]] && echo set",
    "read -r line < f; echo \"$line\"",
    "while IFS= read -r line; do echo \"$line\"; done < f",
    "printf -v out '%s-%s' a b; echo \"$out\"",
    "mapfile -t lines < f; echo \"${lines[@]}\"",
    "declare -a arr; arr[0]=x; echo ${arr[0]}",
    "export FOO=$(echo x); echo $FOO",
    "local x=1",
    "echo ${x:-default} ${x#pre} ${x%%.*} ${x/a/b} ${x^^} ${x@Q} ${!pre*} ${!a[@]}",
    "let i=1+2 j=i*2",
    "cat <<EOF\n$(( 1 + 1 ))\nEOF",
]


@pytest.mark.parametrize("command", ORDINARY)
def test_ordinary_commands_are_still_judged(command: str) -> None:
    command_parts(command)  # readable
    decision = POLICY.evaluate(command)
    assert decision.rule != "unparseable", decision.explain()


def test_the_reason_says_what_bash_evaluates() -> None:
    d = POLICY.evaluate(f"x='a[{P}]'; echo $((x))")
    assert d.rule == "unparseable" and "`x`" in d.reason and "arithmetic" in d.reason
    d = POLICY.evaluate(f"echo $(( '{P}' ))")
    assert d.rule == "unparseable" and "arithmetic" in d.reason
    d = POLICY.evaluate("echo ${x@P}")
    assert d.rule == "unparseable" and "@P" in d.reason


def test_parse_alone_checks_names_too() -> None:
    with pytest.raises(ShellParseError):
        parse(f"x='a[{P}]'; echo $((x))")
    assert parse("x=1; echo $((x))")


_SAFE = st.sampled_from(["1", "i", "$i", "${#a[@]}", "0x1f", "n+1", "a[i]", "(i)", "$#"])
_BAD = st.sampled_from([f"'{P}'", f"a['{P}']", "$1", "`pwned`", "${x:-1}", "\\1",
                        "$'1'", "x[$(pwned)]", "${!y}"])
_WRAP = st.sampled_from(["echo $(( {} ))", "echo $[ {} ]", "(( {} ))", "[[ {} -eq 1 ]]",
                         "[[ 1 -lt {} ]]", "echo ${{a[{}]}}", "echo ${{x:{}}}", "a[{}]=1",
                         "let 'y={}'", "read 'r[{}]'", "printf -v 'r[{}]' x",
                         "test -v 'r[{}]'", "echo \"$(( {} ))\"", "x=({}); echo $((x))"])


@settings(max_examples=300, deadline=None)
@given(_WRAP, st.lists(st.one_of(_SAFE, _BAD), min_size=1, max_size=3))
def test_any_evaluated_operand_that_is_not_plain_is_unparseable(
    wrap: str, operands: list[str]
) -> None:
    """Property: a context bash evaluates holding anything but numbers, names, simple
    parameters and operators is unparseable; holding only those, it is judged."""
    expr = "+".join(operands)
    command = wrap.format(expr)
    bad = any(o.startswith(("'", "a['", "$1", "`", "${x", "\\", "$'", "x[$", "${!"))
              for o in operands)
    if wrap.startswith("x=("):
        bad = True  # x's value is not a plain number
    decision = POLICY.evaluate(command)
    if bad:
        assert decision.rule == "unparseable", (command, decision.explain())
    elif not wrap.startswith("((") and not (wrap.startswith("[[") and "(" in expr):
        # dash reads `(( $i ))` as subshells running `$i`; bash refuses `[[ (i) -eq 1 ]]`
        assert decision.rule != "unparseable", (command, decision.explain())
