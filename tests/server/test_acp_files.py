"""The confinement of ``corral acp``'s relay of file edits into the editor's directory
(:mod:`corral.server._acp_files`): hostile paths from the sandbox, symlinks in the user's
tree, and the last-event-per-path reading of a run's file events."""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.server._acp_files import (
    Change,
    EditorTree,
    Refused,
    SyncState,
    changed_files,
    safe_relative,
)


@pytest.mark.parametrize("path", [
    "", "/etc/passwd", "../x", "a/../../x", "a//b", "./a", "a/./b", "a/", ".git/hooks/pre-commit",
    "src/.git/config", "node_modules/x/index.js", "a\x00b", "x" * 5000, 7, None])
def test_hostile_paths_are_refused(path: object) -> None:
    with pytest.raises(Refused):
        safe_relative(path)


@given(st.text(alphabet="ab./\x00", max_size=12))
def test_a_safe_path_never_leaves_the_root(path: str) -> None:
    try:
        rel = safe_relative(path)
    except Refused:
        return
    joined = posixpath.normpath(posixpath.join("/root", rel))
    assert joined.startswith("/root/") and ".." not in rel.split("/")


def test_symlinks_in_the_users_tree_are_never_followed(tmp_path: Path) -> None:
    root = tmp_path / "project"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f").write_text("outside\n")
    (root / "dir").symlink_to(outside)
    (root / "file").symlink_to(outside / "f")
    tree = EditorTree(str(root))
    with pytest.raises(Refused, match="dir is not a directory"):
        tree.write("dir/new", b"x")
    with pytest.raises(Refused, match="not a regular file"):
        tree.write("file", b"x")
    with pytest.raises(Refused, match="not a regular file"):
        tree.delete("file")
    with pytest.raises(Refused):
        tree.state("dir/f")
    assert tree.read("file") is None
    assert (outside / "f").read_text() == "outside\n" and not (outside / "new").exists()
    assert sorted(os.listdir(outside)) == ["f"]


def test_writes_replace_whole_files_keep_their_mode_and_make_directories(
        tmp_path: Path) -> None:
    tree = EditorTree(str(tmp_path))
    (tmp_path / "run.sh").write_text("old\n")
    (tmp_path / "run.sh").chmod(0o750)
    before = tree.state("run.sh")
    after = tree.write("run.sh", b"new\n")
    assert after != before and tree.state("run.sh") == after
    assert (tmp_path / "run.sh").read_text() == "new\n"
    assert (tmp_path / "run.sh").stat().st_mode & 0o777 == 0o750
    tree.write("a/b/c.txt", b"deep\n")
    assert (tmp_path / "a" / "b" / "c.txt").read_text() == "deep\n"
    assert not [n for n in os.listdir(tmp_path) if ".corral-" in n]  # no temporary left
    tree.delete("a/b/c.txt")
    assert tree.state("a/b/c.txt") is None
    tree.delete("never/was")  # nothing to do


def test_the_last_event_of_each_path_counts_and_odd_names_are_set_apart(
        tmp_path: Path) -> None:
    def ev(kind: str, path: str, **more: object) -> dict[str, object]:
        return {"type": "CUSTOM", "name": "sandbox.file",
                "value": {"type": kind, "path": path, **more}}

    changes, odd = changed_files([
        ev("create", "a"), ev("change", "b"), {"type": "CUSTOM", "name": "other"},
        ev("delete", "a"), ev("create", "\ufffd", pathBytes="/w=="), ev("bogus", "c"),
        {"type": "CUSTOM", "name": "sandbox.file", "value": "junk"}])
    assert changes == [Change("change", "b"), Change("delete", "a")]
    assert odd == ["\ufffd"]
    sync = SyncState({"a": (1, 2)})
    sync.save(tmp_path / "s" / "x.json")
    assert SyncState.load(tmp_path / "s" / "x.json") == sync
    (tmp_path / "bad.json").write_text("[1]")
    assert SyncState.load(tmp_path / "bad.json") is None
