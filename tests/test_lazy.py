"""Lazy namespaces (:mod:`corral._lazy`): a namespace's ``TYPE_CHECKING`` block is its only
list of names. The block is read with string methods for speed; here that reading is checked
against :mod:`ast` (on every namespace, and on generated blocks), anything else in a block is
an ImportError naming its line, and a sourceless install imports the block as it stands."""

from __future__ import annotations

import ast
import compileall
import importlib
import importlib.util
import json
import keyword
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import corral
from corral._lazy import exports_of

SRC = Path(corral.__file__).parent


def _namespace_files() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if "\nif TYPE_CHECKING or not lazy_namespace(globals()" in path.read_text():
            parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found.append((".".join(parts), path))
    return found


def _by_ast(source: str, package: str) -> dict[str, tuple[str, str]]:
    """What the type checker reads: every ``from … import … as …`` of the top-level
    ``if TYPE_CHECKING…:`` block."""
    blocks = [n for n in ast.parse(source).body
              if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)]
    assert len(blocks) == 1
    out: dict[str, tuple[str, str]] = {}
    for node in blocks[0].body:
        assert isinstance(node, ast.ImportFrom)
        module = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
        for alias in node.names:
            assert alias.asname is not None
            out[alias.asname] = (module, alias.name)
    return out


def test_every_namespace_is_lazy_and_reads_as_ast_reads_it() -> None:
    files = _namespace_files()
    assert {name for name, _ in files} >= {
        "corral", "corral.abc", "corral.agents", "corral.harness", "corral.journal",
        "corral.net", "corral.policy", "corral.providers", "corral.runs", "corral.sandbox",
        "corral.server", "corral.stores", "corral.testing", "corral.tools"}
    for package, path in files:
        source = path.read_text()
        exports = exports_of(source, package, str(path))
        assert exports == _by_ast(source, package), package
        assert list(exports) == list(exports.keys())  # the block's order
        assert importlib.import_module(package).__all__ == list(exports), package


def test_a_namespace_module_holds_nothing_but_its_list() -> None:
    # One list: no second map, no hand-written __all__, no code of its own to keep in step.
    for package, path in _namespace_files():
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [ast.unparse(t) for t in targets]
                assert names == ["_MOVED"], f"{package} assigns {names}"
            else:
                assert isinstance(node, ast.Expr | ast.ImportFrom | ast.If), (
                    f"{package}:{node.lineno} {type(node).__name__}")


# -- generated blocks --------------------------------------------------------------------------

IDENT = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True).filter(
    lambda s: not keyword.iskeyword(s))
MODULE = st.tuples(st.integers(0, 2), st.lists(IDENT, min_size=1, max_size=3)).map(
    lambda t: "." * t[0] + ".".join(t[1]))
COMMENT = st.sampled_from(["", "  # a comment", "  # from x import y", "  # (unbalanced"])


@st.composite
def blocks(draw: st.DrawFn) -> str:
    exported = draw(st.lists(IDENT, min_size=1, max_size=12, unique=True))
    lines = ["\"\"\"A namespace.\"\"\"", "", "from typing import TYPE_CHECKING", "",
             draw(st.sampled_from(["if TYPE_CHECKING:",
                                   "if TYPE_CHECKING or not lazy_namespace(globals()):"]))]
    while exported:
        count = draw(st.integers(1, 4))
        take, exported = exported[:count], exported[count:]
        items = [f"{draw(st.sampled_from([n, draw(IDENT)]))} as {n}" for n in take]
        head = f"    from {draw(MODULE)} import "
        style = draw(st.sampled_from(["flat", "wrapped", "one-per-line"]))
        comma = draw(st.sampled_from(["", ","])) if style != "flat" else ""
        if style == "flat":
            lines.append(head + ", ".join(items) + draw(COMMENT))
        elif style == "wrapped":
            lines.append(head + "(" + ", ".join(items) + comma + ")" + draw(COMMENT))
        else:
            lines.append(head + "(" + draw(COMMENT))
            lines += [f"        {item}," + draw(COMMENT) for item in items[:-1]]
            lines += [f"        {items[-1]}{comma}" + draw(COMMENT), "    )"]
        if draw(st.booleans()):
            lines.append(draw(st.sampled_from(["", "    # between", "# at column 0"])))
    lines += draw(st.sampled_from([[], [""], ["", "x = 1"], ["", "def f() -> None: ..."]]))
    return "\n".join(lines) + "\n"


# no timings in a pass/fail test: neither a deadline nor the generation-speed check
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blocks())
def test_generated_blocks_read_as_ast_reads_them(source: str) -> None:
    package = "corral.pkg.sub"
    assert exports_of(source, package, "x.py") == _by_ast(source, package)


# -- what a block may not hold -----------------------------------------------------------------

HEAD = "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"


@pytest.mark.parametrize(("body", "error"), [
    ("    from a import B\n", r"x.py:4: 'B' is not `NAME as NAME`"),
    ("    from a import B as B, C\n", r"x.py:4: 'C' is not `NAME as NAME`"),
    ("    import a\n", r"x.py:4: .* holds `from MODULE import NAME as NAME` lines"),
    ("    import a as a\n", r"x.py:4: .* holds `from MODULE"),
    ("    from a import *\n", r"x.py:4: '\*' is not"),
    ("    from a import B as B\n    C = B\n", r"x.py:5: .* not 'C = B'"),
    ("    from a import (\n        B as B,\n", r"x.py:4: unfinished import"),
    ("    from a import (B as B\n", r"x.py:4: unfinished import"),
    ("    from a import B as B,, C as C\n", r"x.py:4: '' is not"),
    ("    from a import B as B\n    from b import B as B\n", r"x.py:5: 'B' is exported twice"),
    ("    from ... import B as B\n", r"cannot resolve '...'"),
    ("    from a import B as B\n\nif TYPE_CHECKING:\n    from c import D as D\n",
     r"exactly one .* \(found 2\)"),
])
def test_anything_else_in_the_block_is_an_error_naming_its_line(body: str, error: str) -> None:
    with pytest.raises(ImportError, match=error):
        exports_of(HEAD + body, "corral.pkg", "x.py")


def test_a_namespace_without_a_block_is_an_error() -> None:
    with pytest.raises(ImportError, match=r"x.py: .*exactly one .* \(found 0\)"):
        exports_of('"""Nothing here."""\n', "corral.pkg", "x.py")


# -- sourceless ---------------------------------------------------------------------------------

PROBE = """
import importlib, json, sys, warnings
names = {}
for package in sys.argv[1:]:
    module = importlib.import_module(package)
    names[package] = sorted(module.__all__)
    for name in module.__all__:
        getattr(module, name)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import corral.stores
    moved = corral.stores.Store is importlib.import_module("corral.abc").Store
star = {}
exec("from corral import *", star)
print(json.dumps({"names": names, "moved": moved, "warned": [str(w.message) for w in caught],
                  "star": sorted(k for k in star if k != "__builtins__"),
                  "file": corral.__file__}))
"""


def test_a_sourceless_install_imports_each_block_as_it_stands(tmp_path: Path) -> None:
    # Frozen applications ship bytecode only: there is no block to read, so the block's
    # imports run as written, and every namespace offers the same names.
    shutil.copytree(SRC, tmp_path / "corral", ignore=shutil.ignore_patterns("__pycache__"))
    assert compileall.compile_dir(tmp_path / "corral", legacy=True, quiet=1)
    for source in (tmp_path / "corral").rglob("*.py"):
        source.unlink()
    packages = [name for name, _ in _namespace_files()]
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", PROBE, *packages], env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["file"] == str(tmp_path / "corral" / "__init__.pyc")
    assert got["names"] == {p: sorted(importlib.import_module(p).__all__) for p in packages}
    assert got["moved"] and any("corral.abc.Store" in w for w in got["warned"])
    assert got["star"] == sorted(corral.__all__)


def test_a_reloaded_namespace_reads_its_block_again() -> None:
    import corral.net

    before = list(corral.net.__all__)
    importlib.reload(corral.net)
    assert corral.net.__all__ == before and corral.net.EgressProxy.__module__ == "corral.net"
