"""The package layout is the architecture (DESIGN §1): every import inside ``corral`` — at
module level, inside a function, or under ``TYPE_CHECKING`` — runs from a higher layer to a
lower one (or stays inside its package), so no two packages depend on each other and no import
hides in a function to dodge a cycle. The in-sandbox scripts import nothing of corral."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import corral

SRC = Path(corral.__file__).parent

# Bottom to top. Packages on one line may not import each other.
LAYERS: list[set[str]] = [
    {"_errors", "_lazy", "_log", "_suggest", "_telemetry", "_version"},
    {"_durations", "_plugins"},
    {"_paths", "_ids", "_validate"},
    {"_cmdline"},  # what every command line shares (the CLI's and the server's)
    {"journal", "policy"},
    {"stores"},
    {"sandbox"},
    {"providers"},
    {"net", "tools"},
    {"harness"},
    {"agents"},
    {"runs"},
    {"server"},
    {"cli"},
    # The public modules sit on top: ``corral.abc`` re-exports protocols from below (and no
    # internal module may import it); ``corral.testing`` may use it.
    {"abc"},
    {"testing"},
]
RANK = {pkg: rank for rank, pkg in enumerate(LAYERS) for pkg in pkg}
SCRIPTS = "_insandbox"  # stdlib only: copied into sandboxes and run there


def _unit(module: str) -> str:
    """``corral.runs._runner`` -> ``runs``; ``corral._errors`` -> ``_errors``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "corral"


def _imports(path: Path, module: str) -> Iterator[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            yield node.lineno, target
            for alias in node.names:  # ``from corral.x import _y``: the submodule counts
                yield node.lineno, f"{target}.{alias.name}"


def _modules() -> Iterator[tuple[Path, str]]:
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield path, ".".join(parts)


def test_every_package_is_in_a_layer() -> None:
    units = {_unit(module) for _path, module in _modules()} - {"corral", "__main__", SCRIPTS}
    assert units <= set(RANK), f"place these in LAYERS: {sorted(units - set(RANK))}"


def test_imports_run_downward_only() -> None:
    wrong: list[str] = []
    for path, module in _modules():
        source = _unit(module)
        if source in {"corral", "__main__"}:
            continue  # the public face and ``python -m corral`` sit on top of everything
        for line, target in _imports(path, module):
            if not (target == "corral" or target.startswith("corral.")):
                continue
            if target == "corral":
                wrong.append(f"{path.relative_to(SRC)}:{line} imports the public face")
                continue
            dest = _unit(target)
            if dest == source:
                continue
            if source == SCRIPTS:
                wrong.append(f"{path.relative_to(SRC)}:{line} (in-sandbox script) -> {target}")
                continue
            if dest == SCRIPTS:
                continue  # read as files to copy into the sandbox
            if dest not in RANK or RANK[dest] >= RANK[source]:
                wrong.append(f"{path.relative_to(SRC)}:{line} {source} -> {dest}")
    assert not wrong, "imports against the layers:\n" + "\n".join(sorted(set(wrong)))


def test_in_sandbox_scripts_import_only_the_standard_library() -> None:
    import sys

    scripts = sorted((SRC / SCRIPTS).glob("*.py"))
    assert scripts, "the in-sandbox scripts moved"
    for path in scripts:
        for line, target in _imports(path, f"corral.{SCRIPTS}.{path.stem}"):
            top = target.split(".")[0]
            assert top in sys.stdlib_module_names or top == "__future__", (
                f"{path.name}:{line} imports {target}: in-sandbox scripts are stdlib only"
            )
